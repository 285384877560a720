"""procrastinate announces every job inserted with status 'todo' (a NOTIFY on its queue's channel at commit), and a
job runner that hears it fetches at once. A job scheduled for later (the fallback of an answer the web process sends
itself, of a call the gateway sends; a mail digest) cannot be fetched then: the announcement only woke the worker to
fetch nothing, at the very moment the web process sends the answer or the call that job is the fallback of
(bench/approval.py: answer stored → `tasks/update` at the server 10.4 and 11.5 ms with it, 7.3 and 7.0 without).
Such a job is found by the runners' polling when it falls due, as before (worker.py's FETCH_POLL_SECONDS).

procrastinate's own trigger (its migration 03.00.00_50), with one more condition: the job is due at insert.
tests/test_forks.py fails if procrastinate's version changes (procrastinate_sql.WRITTEN_FOR)."""

from django.db import migrations

ANNOUNCE_ONLY_DUE_INSERTS = """
DROP TRIGGER procrastinate_jobs_notify_queue_job_inserted_v1 ON procrastinate_jobs;
CREATE TRIGGER procrastinate_jobs_notify_queue_job_inserted_v1
    AFTER INSERT ON procrastinate_jobs
    FOR EACH ROW WHEN (new.status = 'todo'::procrastinate_job_status
                       AND (new.scheduled_at IS NULL OR new.scheduled_at <= clock_timestamp()))
    EXECUTE PROCEDURE procrastinate_notify_queue_job_inserted_v1();
"""

ANNOUNCE_EVERY_INSERT = """
DROP TRIGGER procrastinate_jobs_notify_queue_job_inserted_v1 ON procrastinate_jobs;
CREATE TRIGGER procrastinate_jobs_notify_queue_job_inserted_v1
    AFTER INSERT ON procrastinate_jobs
    FOR EACH ROW WHEN ((new.status = 'todo'::procrastinate_job_status))
    EXECUTE PROCEDURE procrastinate_notify_queue_job_inserted_v1();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0024_task_server_log_lines"),
        ("procrastinate", "0041_post_retry_failed_job"),
    ]

    operations = [
        migrations.RunSQL(ANNOUNCE_ONLY_DUE_INSERTS, reverse_sql=ANNOUNCE_EVERY_INSERT),
    ]
