"""Prices as money: in the currency's minor units (ISO 4217's exponent), not the API's six
decimal places. Stdlib only, as the rest of the CLI."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

# ISO 4217 currencies whose minor unit is not the cent; every other has two places.
NO_MINOR = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"
THOUSANDTHS = "BHD IQD JOD KWD LYD OMR TND"
TEN_THOUSANDTHS = "CLF UYW"
MINOR_UNITS = {
    code: places
    for codes, places in ((NO_MINOR, 0), (THOUSANDTHS, 3), (TEN_THOUSANDTHS, 4))
    for code in codes.split()
}


def money(amount: str | None, currency: str) -> str:
    """The API's decimal string in `currency`'s minor units ("2.500000" EUR -> "2.50",
    "350.000000" JPY -> "350"); more places only where the price has them, so nothing is
    rounded away ("0.012500" EUR -> "0.0125"). None or a string that is no number as it came."""
    if amount is None:
        return ""
    try:
        value = Decimal(amount)
    except InvalidOperation:
        return amount
    places = MINOR_UNITS.get(currency.upper(), 2)
    exponent = value.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        return format(value.normalize(), "f")
    return format(value.quantize(Decimal(1).scaleb(-places)), "f")
