"""Template filters of the lock pages: `{{ seconds|duration }}` and `{{ moment|when }}` (locks.formats)."""

from __future__ import annotations

from django import template

from locks import formats

register = template.Library()
register.filter("duration", formats.duration)
register.filter("when", formats.when)
