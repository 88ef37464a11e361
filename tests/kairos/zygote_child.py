"""A module the zygote test forks (tests/kairos/test_zygote.py): it says what it was
given, then exits with the code it was asked for, or sleeps to be killed."""

import os
import sys
import time

print(f"env={os.environ.get('ZYGOTE_TEST')} argv0={sys.argv[0]} pgid_is_pid="
      f"{os.getpgid(0) == os.getpid()}", flush=True)
if os.environ.get("ZYGOTE_SLEEP"):
    time.sleep(60)
if os.environ.get("ZYGOTE_RAISE"):
    raise RuntimeError("boom from the child")
sys.exit(int(os.environ.get("ZYGOTE_EXIT", "0")))
