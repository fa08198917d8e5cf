"""Secrets stay out of everything compactd emits, through the real daemon: the PostgreSQL
password in every form libpq takes it (a URI's user part or its `password=` / `sslpassword=`
parameters, percent-encoded or not; a keyword/value string, quoted or not) is printed as
`***` at start-up even where the driver's own message quotes it back, and a provider error
that echoes the API key (a gateway may) is relayed without it — in the error, and in the
daemon's log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from compactd.clients.client import CompactdClient
from compactd.context.secrets import SECRET_KEYWORDS, connection_secrets

from tests.summary.helpers import BASE_CONFIG, turn
from tests.support.fake_anthropic import FakeAnthropic, Reply

SECRET = "hunter2-Secret"
NOWHERE = "/nonexistent-socket-dir"
FORMS = {
    "URI user part": f"postgresql://me:{SECRET}@/db?host={NOWHERE}",
    "URI password=": f"postgresql:///db?host={NOWHERE}&password={SECRET}",
    "URI sslpassword=": f"postgresql://me@/db?host={NOWHERE}&sslpassword={SECRET}",
    "URI, a name percent-encoded": f"postgres:///db?host={NOWHERE}&pass%77ord={SECRET}",
    "URI, a value percent-encoded": f"postgresql:///db?host={NOWHERE}&password=hunter2%2DSecret",
    "URI, a value the driver quotes back": f"postgresql:///db?host={NOWHERE}&password={SECRET} x",
    "keyword/value": f"host={NOWHERE} user=me password={SECRET}",
    "keyword/value, sslpassword": f"host={NOWHERE} sslpassword={SECRET} dbname=db",
    "keyword/value, quoted": f"host={NOWHERE} password = '{SECRET} with \\' spaces'",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_secrets_of_a_connection_string_are_the_ones_libpq_reads(form: str) -> None:
    """What compactd takes for the secrets of each form is what libpq itself parses."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parsed = conninfo_to_dict(FORMS[form])
    except Exception:  # libpq refuses it (spaces in a URI): ours must still find the secret
        assert any(SECRET in s for s in connection_secrets(FORMS[form]))
        return
    libpq = {str(v) for k, v in parsed.items() if k in SECRET_KEYWORDS}
    assert set(connection_secrets(FORMS[form])) == libpq


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_store_password_is_never_printed_at_start_up(form: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "compactd", "--data-dir", str(tmp_path), "serve"]
    done = subprocess.run(
        [*command, "--store", FORMS[form]],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    said = done.stdout + done.stderr
    assert "***" in said, said
    assert "hunter2" not in said, said


@pytest.mark.asyncio
async def test_a_provider_error_that_echoes_the_key_is_relayed_without_it(
    tmp_path: Path,
) -> None:
    key = "sk-ant-api03-test-0123456789abcdef"
    log = tmp_path / "daemon.log"
    with FakeAnthropic(api_key=key) as fake, log.open("wb") as err:
        fake.default = Reply.error(401, message=f"invalid x-api-key: {key}")
        client = await CompactdClient.spawn(
            data_dir=str(tmp_path / "data"),
            args=["--summary-provider", "anthropic", "--no-watch", "--log-level", "INFO"],
            env={"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": key},
            stderr=err,
            timeout=30,
        )
        notified: list[object] = []
        client.on_notification("context/compacted", notified.append)
        try:
            sid = (await client.open_session(None, BASE_CONFIG)).session_id
            await client.append(sid, [m for k in range(6) for m in turn(f"k{k}")])
            failed = await client.compact(sid, window=32_000)  # a result that did nothing
            assert not failed.applied and failed.failure == "auth"
            assert fake.messages_requests(), "the provider was asked"
        finally:
            await client.close()
    assert "invalid x-api-key: ***" in failed.reason, failed.reason
    assert key not in str(failed) and key not in str(notified)
    assert key not in log.read_text(), "the daemon's log holds the key"
