"""A headless Chromium driven through Selenium, for the dashboard's browser test
(``tests/integration/test_dashboard_browser.py``) and its screenshot
(``scripts/dashboard_screenshot.py``).

Debian's ``chromium`` and ``chromium-driver`` packages give the browser and the
driver (``scripts/setup.sh`` installs them); the paths are given explicitly so
Selenium never tries to download a driver.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class BrowserMissing(RuntimeError):
    """Chromium, its driver or Selenium is not installed (``make setup`` installs them)."""


def _find(name: str, default: str) -> str:
    found = shutil.which(name) or default
    if not Path(found).exists():
        raise BrowserMissing(f"{name} not found: run `make setup` (Debian package {name})")
    return found


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A Selenium WebDriver of a fresh headless Chromium (own profile), quit on exit.

    ``--no-sandbox``: Chromium's sandbox refuses to run as root, which the
    emulation needs."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserMissing("selenium is not installed: run `make setup`") from None
    options = webdriver.ChromeOptions()
    options.binary_location = _find("chromium", CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    service = Service(executable_path=_find("chromedriver", CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
