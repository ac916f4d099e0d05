"""API tokens from the command line: create (shown once), list, revoke."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from shop.api.tokens import revoke
from shop.models import ApiToken


class Command(BaseCommand):
    help = "Create, list or revoke API bearer tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token for USERNAME and print it (once)")
        create.add_argument("username")
        create.add_argument("--name", default="")
        listing = sub.add_parser("list", help="list tokens (of USERNAME)")
        listing.add_argument("username", nargs="?")
        rev = sub.add_parser("revoke", help="revoke a token by its prefix or id")
        rev.add_argument("token")

    def handle(self, *args, **opts) -> None:
        action = opts["action"]
        if action == "create":
            user = get_user_model().objects.filter(username=opts["username"]).first()
            if user is None:
                raise CommandError(f"no user {opts['username']!r}")
            self.stdout.write(ApiToken.issue(user_id=user.pk, name=opts["name"]))
        elif action == "list":
            tokens = ApiToken.objects.select_related("user")
            if opts["username"]:
                tokens = tokens.filter(user__username=opts["username"])
            for t in tokens:
                state = "revoked" if t.revoked_at else "active"
                used = t.last_used_at.isoformat() if t.last_used_at else "never used"
                self.stdout.write(f"{t.pk:>6}  {t.prefix}...  {t.user.username:<20} {state:<8} {used}  {t.name}")
        else:
            ref = opts["token"]
            matches = ApiToken.objects.filter(pk=int(ref)) if ref.isdigit() else ApiToken.objects.filter(
                prefix__startswith=ref[:12]) if len(ref) >= 6 else ApiToken.objects.none()
            if matches.count() != 1:
                raise CommandError(f"{ref!r} matches {matches.count()} tokens; give the id or a longer prefix")
            token = revoke(token=matches.get())
            self.stdout.write(f"revoked {token.prefix}... of {token.user.username}")
