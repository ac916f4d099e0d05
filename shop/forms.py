"""Forms of the web checkout. Limits come from SHOP settings, the same as the API's."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib.auth.forms import UserCreationForm

from shop.conf import shop_settings


class QuantityForm(forms.Form):
    quantity = forms.IntegerField(min_value=0, initial=1)

    def clean_quantity(self) -> int:
        qty = self.cleaned_data["quantity"]
        cap = int(shop_settings.MAX_QUANTITY_PER_LINE)
        if qty > cap:
            raise forms.ValidationError(f"At most {cap} per order.")
        return qty


class AddToCartForm(QuantityForm):
    """The product page's form: at least one (0 on the cart page means remove; here, a mistake)."""

    def clean_quantity(self) -> int:
        qty = super().clean_quantity()
        if qty < 1:
            raise forms.ValidationError("Pick at least 1.")
        return qty


class CheckoutForm(forms.Form):
    # Radio buttons, not a select: each choice says what it does to this cart, and a select cuts
    # such a label off on a phone.
    coupon_code = forms.ChoiceField(required=False, label="Coupon", widget=forms.RadioSelect)
    # Generated when the page renders: a double click or a resubmit posts the same key.
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=128)

    def __init__(self, *args, codes: list[tuple[str, str]] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["coupon_code"].choices = [("", "No coupon"), *codes]
        if not self.is_bound and not self.initial.get("idempotency_key"):
            self.initial["idempotency_key"] = uuid.uuid4().hex


class SignUpForm(UserCreationForm):
    """Username and password; an e-mail address is optional (order confirmations, password resets)."""

    class Meta(UserCreationForm.Meta):
        fields = ("username", "email")
        help_texts = {"email": "Optional: for your order confirmations and to reset a forgotten password."}


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="What it is for, e.g. 'locust'")
