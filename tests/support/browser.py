"""Headless Chromium (Debian's `chromium` and `chromium-driver`) driven through Selenium.

The packages are installed by `deploy/local/browser.sh` when missing, so the console tests run on
a fresh machine; each browser gets a new, empty profile directory.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = REPO / ".local" / "console"


def ensure_browser() -> None:
    """Installs Chromium and its driver with the project's script when they are missing."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    subprocess.run([str(REPO / "deploy" / "local" / "browser.sh")], check=True, timeout=900)


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile, quit on leaving."""
    ensure_browser()
    with tempfile.TemporaryDirectory(prefix="console-browser-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            yield driver
        finally:
            driver.quit()


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """Saves the whole page as `.local/console/<name>.png` for people to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(1000, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(path))
    return path
