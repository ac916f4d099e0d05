# Sourced by the docs/bench_*.sh scripts that start a server from two trees: each tree's own layout
# (the project in config/ since the project left the shop app; in shop/ before), so a tree from
# before the move can still be the "before".
project_of() { if [ -d "$1/config/settings" ]; then echo config; else echo shop; fi; }
gunicorn_conf_of() { if [ -f "$1/config/gunicorn.conf.py" ]; then echo config/gunicorn.conf.py; else echo gunicorn.conf.py; fi; }
# Each tree's manage.py and wsgi.py choose its own settings; one exported by the caller would not fit both.
unset DJANGO_SETTINGS_MODULE
