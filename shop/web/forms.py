"""Forms of the web checkout (and the password reset's). Limits come from SHOP settings, the same as the API's."""

from __future__ import annotations

import uuid

from django import forms
from django.contrib.auth.forms import PasswordResetForm, UserCreationForm
from django.contrib.sites.shortcuts import get_current_site

from shop.conf import shop_settings
from shop.services.emails import queue_password_reset


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


class CouponCodeForm(forms.Form):
    """The checkout's "Have a code?" box (claimed and picked in one step: views.checkout_code)."""

    code = forms.CharField(label="Have a code?", max_length=200,
                           error_messages={"required": "Type your coupon's code."})


class SignUpForm(UserCreationForm):
    """Username and password; an e-mail address is optional (order confirmations, password resets)."""

    class Meta(UserCreationForm.Meta):
        fields = ("username", "email")
        help_texts = {"email": "Optional: for your order confirmations and to reset a forgotten password."}


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="What it is for, e.g. 'locust'")


class QueuedPasswordResetForm(PasswordResetForm):
    """Django's reset form, whose save() queues the mail instead of sending it.

    Django's own save() looks the address up and sends a mail, synchronously, only when an
    account has it: the response time told who has an account, and a slow mail server held the
    request. This one does the same work for every address, one outbox row and no lookup; the
    `shop.send_mail` job finds the accounts and makes each one's token when it sends."""

    def save(self, domain_override: str | None = None, use_https: bool = False, request=None, **ignored) -> None:
        if domain_override:
            site_name = domain = domain_override
        else:
            site = get_current_site(request)
            site_name, domain = site.name, site.domain
        queue_password_reset(email=self.cleaned_data["email"], domain=domain, site_name=site_name,
                             protocol="https" if use_https else "http")
