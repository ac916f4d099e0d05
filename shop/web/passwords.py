"""Password rules beyond Django's own validators (settings.AUTH_PASSWORD_VALIDATORS)."""

from __future__ import annotations

from django.core.exceptions import ValidationError


class NotBlankPasswordValidator:
    """Refuse passwords made only of whitespace.

    Django's validators accept eight spaces: long enough, not numeric, not in the common list.
    """

    def validate(self, password: str, user: object = None) -> None:
        if not password.strip():
            raise ValidationError("This password is only spaces.", code="password_blank")

    def get_help_text(self) -> str:
        return "Your password can't be only spaces."
