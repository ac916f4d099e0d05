# The web app for docker-compose (users' laptops). Tests never need Docker.
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc pkg-config default-libmysqlclient-dev curl \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.txt requirements-bench.txt ./
RUN pip install --no-cache-dir -r requirements-bench.txt
COPY . .
ENV DJANGO_SETTINGS_MODULE=config.settings PYTHONUNBUFFERED=1
RUN DEBUG=false SECRET_KEY=build-only python manage.py collectstatic --no-input -v 0
EXPOSE 8000
# No demo data (it has an admin/admin superuser) unless the container is started with SEED_DEMO=1,
# as docker-compose.yml does for laptops. The first real superuser: manage.py createsuperuser.
# config/gunicorn.conf.py: the shop's worker (a crowd's excess is answered 503 busy at once, docs/operations.md)
# and Prometheus multi-process mode for /metrics (docs/metrics.md).
CMD ["sh", "-c", "python manage.py migrate --no-input && if [ \"${SEED_DEMO:-0}\" = 1 ]; then python manage.py seed_demo; fi && exec gunicorn config.wsgi -c config/gunicorn.conf.py --bind 0.0.0.0:8000 --workers ${WEB_WORKERS:-4} --threads ${WEB_THREADS:-16} --access-logfile -"]
