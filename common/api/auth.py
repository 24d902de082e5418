"""`POST /api/v1/auth/token/`: a token for a username and password, behind the login guard.

The same guard as the portal's login (`common.login_guard`): failures counted per account and
address, per address, and per account from anywhere (a backoff no client address changes),
refused with 429 and Retry-After past any limit even for the right password, and logged with
the username and the address. Successful logins count for nothing. On top of the guard, a rate
limit per client address (`LoginThrottle`, GANTRY_THROTTLE_LOGIN). The view authenticates
nobody: a token or session sent along does not lift the guard.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common import login_guard
from common.api.parsers import BoundedJSONParser
from common.api.serializers import refuse_loose_input
from common.api.throttles import LoginThrottle
from common.api.tokens import token_expires, token_for_login, token_rotate

TokenOut = inline_serializer(
    "TokenOut", {"token": serializers.CharField(), "expires": serializers.DateTimeField()}
)


class GuardedObtainAuthToken(ObtainAuthToken):
    authentication_classes: list[Any] = []
    throttle_classes = [LoginThrottle]
    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]

    @extend_schema(
        request=AuthTokenSerializer,
        responses={
            200: TokenOut,
            429: OpenApiResponse(
                description="Too many failed logins for this account or from this address, "
                "or too many attempts: wait Retry-After seconds."
            ),
        },
        auth=[],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if not hasattr(request.data, "get"):
            raise ValidationError({"non_field_errors": ["expected a JSON object."]})
        # A field the login does not take is a 400 naming it, as on every other write, and
        # not a failed login: it is refused before the guard counts anything.
        refuse_loose_input(self.get_serializer(), request.data)
        raw = request.data.get("username", "")
        username = raw[:150] if isinstance(raw, str) else ""
        address = login_guard.client_address(request._request)
        refusal = login_guard.refusal(username, address)
        if refusal is not None:
            # Refused before the password is checked, so a lockout cannot confirm a guess.
            login_guard.record_refusal(username, address, surface="API")
            return Response(
                {"detail": refusal.message()},
                status=status.HTTP_429_TOO_MANY_REQUESTS,
                headers={"Retry-After": str(refusal.wait_s)},
            )
        serializer = self.get_serializer(data=request.data)
        if not serializer.is_valid():
            login_guard.record_failure(username, address, surface="API")
            raise ValidationError(serializer.errors)
        user = serializer.validated_data["user"]
        login_guard.record_success(user.get_username(), address)
        token = token_for_login(user=user)
        return Response({"token": token.key, "expires": token_expires(token)})


class RotateToken(APIView):
    """`POST /api/v1/auth/token/rotate/`, sent with the token to replace: a fresh token (with a
    full lifetime), and the one sent is revoked at once."""

    parser_classes = [BoundedJSONParser]

    @extend_schema(request=None, responses={200: TokenOut})
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if request.data:  # it takes nothing: a field sent is a 400 naming it
            refuse_loose_input(serializers.Serializer(), request.data)
        if not isinstance(request.auth, Token):
            raise PermissionDenied(
                "Only a token can be rotated: send it as `Authorization: Token <key>`."
            )
        token = token_rotate(token=request.auth)
        return Response({"token": token.key, "expires": token_expires(token)})
