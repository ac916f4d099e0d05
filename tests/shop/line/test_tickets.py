"""Line tickets: signed for one account, read back without Redis or MySQL (no database here)."""

from __future__ import annotations

import pytest

from shop.line import tickets
from shop.line.tickets import PLACE, PRE_QUEUE, Ticket, not_yet, read, verify


def test_a_ticket_reads_back_for_its_account_only():
    ticket = Ticket(product_id=7, drop=1_795_000_000, kind=PLACE, score=1_795_000_000_123_456)
    text = ticket.text(user_id=42)
    assert read(text, user_id=42) == ticket
    assert read(text, user_id=43) is None


@pytest.mark.parametrize("change", [
    lambda parts: [parts[0], parts[1], parts[2], str(int(parts[3]) - 1), *parts[4:]],  # an earlier place
    lambda parts: [str(int(parts[0]) + 1), *parts[1:]],  # another product
    lambda parts: [parts[0], str(int(parts[1]) + 60), *parts[2:]],  # another drop
    lambda parts: [parts[0], parts[1], PRE_QUEUE, *parts[3:]],  # another kind
    lambda parts: [*parts[:5], parts[5][:-1] + ("A" if parts[5][-1] != "A" else "B")],  # the signature
    lambda parts: parts[:5],  # no signature
    lambda parts: [parts[0], parts[1], parts[2], "+" + parts[3], *parts[4:]],  # the same number, written otherwise
    lambda parts: [*parts[:4], "43", parts[5]],  # another account's name on it
])
def test_an_altered_ticket_is_refused(change):
    text = Ticket(product_id=7, drop=1_795_000_000, kind=PLACE, score=1_795_000_000_123_456).text(user_id=42)
    assert read(".".join(change(text.split("."))), user_id=42) is None


@pytest.mark.parametrize("text", ["", "x" * 500, "....", "1.2.p.3", "a.b.p.3.sig", None, "1.2.p.3.\u00e9\u00e9",
                                  "1.2.p.\u0663.sig"])
def test_garbage_is_refused_not_an_error(text):
    assert read(text, user_id=1) is None


def test_verify_names_the_account_a_ticket_was_given_to():
    ticket = Ticket(product_id=7, drop=1_795_000_000, kind=PLACE, score=5)
    assert verify(ticket.text(user_id=42)) == (ticket, 42)
    assert verify(ticket.text(user_id=42).replace(".42.", ".43.")) is None
    assert verify(None) is None and verify(b"1.2.p.3.4.sig") is None


def test_not_yet_compares_the_place_with_now_serving():
    place = Ticket(product_id=1, drop=2, kind=PLACE, score=1000)
    assert not_yet(place, 999) and not not_yet(place, 1000) and not not_yet(place, 5000)
    assert not_yet(Ticket(product_id=1, drop=2, kind=PRE_QUEUE, score=5), 10**18)  # before the opening: never


def test_a_bound_ticket_verifies_in_the_worker_only_with_its_credential():
    text = Ticket(product_id=3, drop=1_800_000_000, kind=PLACE, score=1_800_000_000_000_123).text(user_id=7)
    token = b"Bearer shp_mine"
    bound = tickets.bound(text, credential=token)
    assert bound.startswith(text + ".") and len(bound) <= tickets.MAX_LENGTH
    assert tickets.verify_bound(bound, credential=token) == tickets.verify(text)
    assert tickets.verify_bound(bound, credential=b"Bearer shp_theirs") is None  # replayed by another
    assert tickets.verify_bound(text, credential=token) is None  # not bound: the app decides
    assert tickets.verify_bound(bound, credential=b"") is None
    # The app reads it as any ticket of its account; an altered binding does not verify.
    assert tickets.read(bound, user_id=7) == tickets.read(text, user_id=7) is not None
    altered = bound[:-1] + ("A" if bound[-1] != "A" else "B")
    assert tickets.verify_bound(altered, credential=token) is None
    assert tickets.bound("garbage", credential=token) == "garbage"
