"""Cancel a running command from another thread, and run several commands at once.

python examples/cancel_from_thread.py      # uses the local emulator unless E2B_API_KEY is set
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

from e2b_provider import CancelToken, DeploymentConfig, E2BSandboxProvider


def run(config: DeploymentConfig) -> None:
    with E2BSandboxProvider(config) as provider:
        sandbox = provider.create("cancel-demo")
        try:
            token = CancelToken()
            threading.Timer(1.0, token.cancel, args=("the user pressed stop",)).start()
            r = provider.exec(sandbox, "echo working; sleep 60", timeout=120.0, cancel=token)
            print(f"cancelled={r.cancelled} exit_code={r.exit_code} stdout={r.stdout!r}")

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                futures = [
                    pool.submit(provider.exec, sandbox, f"sleep 0.5; echo job {i}", timeout=30.0)
                    for i in range(8)
                ]
                for f in futures:
                    print(f.result().stdout.strip())
        finally:
            provider.destroy(sandbox)


if __name__ == "__main__":
    if os.environ.get("E2B_API_KEY"):
        run(DeploymentConfig.from_env())
    else:
        from e2b_provider.emulator import Emulator

        with Emulator() as emu:
            run(emu.config(template="base"))
