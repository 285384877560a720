"""What the people who run taskhub watch: Prometheus metrics (`/metrics`), and the dashboard and alert rules built on
them (docs/grafana/).

- `metrics`: the instruments and the one-line calls other modules make (the bottom of the import layers: it imports
  no other taskhub package, so the worker, the tracker and the live layer may call it);
- `http`: the middleware that counts requests by view and status and times them;
- `jobs`: procrastinate's worker middleware that counts job attempts by kind and outcome;
- `collectors`: what is read from Postgres at each scrape (tasks by status, the inbox, the job queue, leases,
  server health), right whatever the number of processes;
- `views` / `urls`: `/metrics` itself, behind a bearer token and/or an allowed-address setting.
"""
