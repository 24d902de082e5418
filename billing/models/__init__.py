"""Rate cards, metered usage, statements. Money is `Decimal` in the database and in Python."""

from billing.models.books import AdjustmentProposal as AdjustmentProposal
from billing.models.books import MeteringMark as MeteringMark
from billing.models.books import ProposalState as ProposalState
from billing.models.books import StatementSeal as StatementSeal
from billing.models.books import UsageCheck as UsageCheck
from billing.models.budgets import Budget as Budget
from billing.models.budgets import BudgetAlert as BudgetAlert
from billing.models.budgets import BudgetPolicy as BudgetPolicy
from billing.models.budgets import BudgetReservation as BudgetReservation
from billing.models.budgets import BudgetSpend as BudgetSpend
from billing.models.budgets import BudgetUnit as BudgetUnit
from billing.models.exports import CostExport as CostExport
from billing.models.exports import ExportFormat as ExportFormat
from billing.models.exports import ExportState as ExportState
from billing.models.metering import CapacityRecord as CapacityRecord
from billing.models.metering import GuaranteeRecord as GuaranteeRecord
from billing.models.metering import MeteringPeriod as MeteringPeriod
from billing.models.metering import UsageRecord as UsageRecord
from billing.models.rates import RateCard as RateCard
from billing.models.rates import RateMultiplier as RateMultiplier
from billing.models.rates import price as price
from billing.models.statements import BillingPolicy as BillingPolicy
from billing.models.statements import IdlePolicy as IdlePolicy
from billing.models.statements import LineKind as LineKind
from billing.models.statements import Statement as Statement
from billing.models.statements import StatementLine as StatementLine
