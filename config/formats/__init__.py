"""The shop's date formats (settings.FORMAT_MODULE_PATH): one style everywhere in the admin,
"28 Nov 2026 20:15", 24-hour, as the lists' short "28 Nov 20:15"; the input formats stay Django's."""
