"""The committed Jinja fixtures are what python jinja2 renders now (independent of our engine)."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_jinja_fixtures_are_current():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        pytest.skip("python jinja2 is not installed (apt-get install python3-jinja2): cannot check the fixtures")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "jinja_fixtures.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
