"""Forms of the shop's admin: restock, adjust stock, a product and its drop window."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib.admin import widgets
from django.core.exceptions import ValidationError
from django.utils import timezone

from shop import errors
from shop.edge import account_age
from shop.models import StockLedger
from shop.plumbing import clock
from shop.services import inventory
from shop.services.drops import window_problem
from shop.services.lines import MAX_PREQUEUE


class RestockForm(forms.Form):
    quantity = forms.IntegerField(min_value=1, max_value=1_000_000)


def _reason_choices() -> list[tuple[str, str]]:
    """Each reason with the way it goes: "Damaged: removes"."""
    way = {1: "adds", -1: "removes", 0: "adds or removes"}
    return [(r, f"{StockLedger.Reason(r).label}: {way[inventory.ADJUSTMENT_REASONS[r]]}")
            for r in inventory.adjustment_reasons()]


class AdjustStockForm(forms.Form):
    """The fields of an adjustment; `inventory.check_adjustment` (through the service) is the rule."""

    delta = forms.IntegerField(label="Units", help_text="Positive adds units, negative removes them (e.g. -2).")
    reason = forms.ChoiceField(choices=_reason_choices)
    note = forms.CharField(required=False, max_length=inventory.MAX_NOTE_LENGTH,
                           help_text="For the ledger, e.g. “box crushed in transit”.")


WINDOW = ("opens_at", "closes_at")


def _check_window(opens_at, closes_at) -> None:
    """The service's own check of a window, as a form error before anything is saved."""
    if problem := window_problem(opens_at=opens_at, closes_at=closes_at, now=clock.now()):
        raise ValidationError(problem)


def _to_the_second(value):
    return value.replace(microsecond=0) if value is not None else None


class AccountAgeField(forms.Field):
    """A minimum account age as operators write it ("7d", "24h", "90m"; empty: none), read by
    `shop.edge.account_age.parse_age` as the command line reads it."""

    def prepare_value(self, value):
        return account_age.compact(value) if isinstance(value, timedelta) else value

    def to_python(self, value):
        try:
            return account_age.parse_age(str(value or ""))
        except errors.InvalidAccountAge as exc:
            longest = account_age.describe(account_age.MAX_AGE)
            raise ValidationError(f"Write an age as 7d, 24h, 90m or 45s (at most {longest}), or leave it empty "
                                  f"({exc.message})") from None


class ProductForm(forms.ModelForm):
    """The product form; a moved drop window must close after it opens, and not in the past.

    The widgets show whole seconds, so a window counts as moved (`moved`) only when a field
    differs to the second, and one left as shown keeps its exact time (an "End now" has
    microseconds): renaming a product never rewrites, or re-checks, its window."""

    moved: tuple[str, ...] = ()
    min_account_age = AccountAgeField(
        required=False, label="Min account age",
        help_text="Only accounts at least this old may buy (against bots on fresh accounts): 7d, 24h, 90m. "
                  "Empty: any account.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        zone = timezone.get_current_timezone_name()
        for name in WINDOW:  # the time typed is read in the shop's time zone: say which
            if name in self.fields:
                self.fields[name].label = f"{self.fields[name].label} ({zone})"

    def clean_line_prequeue_seconds(self):
        seconds = self.cleaned_data.get("line_prequeue_seconds")
        if seconds is not None and seconds > MAX_PREQUEUE:
            raise ValidationError(f"The pre-queue window is 0 to {MAX_PREQUEUE} seconds (a week).")
        return seconds

    def clean(self):
        data = super().clean()
        self.moved = tuple(f for f in WINDOW if f in data
                           and _to_the_second(data[f]) != _to_the_second(self.initial.get(f)))
        for f in set(WINDOW) - set(self.moved):
            data[f] = self.initial.get(f)
        if self.moved:
            _check_window(data.get("opens_at"), data.get("closes_at"))
        return data


class DropForm(forms.Form):
    """"Schedule drop…" over the selected products: one window for all of them."""

    opens_at = forms.SplitDateTimeField(required=False, widget=widgets.AdminSplitDateTime,
                                        label="Opens at", help_text="Empty: on sale now.")
    closes_at = forms.SplitDateTimeField(required=False, widget=widgets.AdminSplitDateTime,
                                         label="Closes at", help_text="Empty: no end.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        zone = timezone.get_current_timezone_name()
        for field in self.fields.values():
            field.label = f"{field.label} ({zone})"

    def clean(self):
        data = super().clean()
        if not self.errors:
            _check_window(data.get("opens_at"), data.get("closes_at"))
        return data
