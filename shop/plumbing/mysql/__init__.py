"""The project's MySQL / MariaDB backend (`ENGINE = "shop.plumbing.mysql"`): Django's, with a
transaction opened in one round trip less (base.py)."""
