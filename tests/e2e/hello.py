# Ref: draft KBTP §Session Establishment; Guest side: connect, HELLO, GOODBYE.
"""Guest script: connect to the target, print the HELLO_ACK fields, say GOODBYE."""
import sys
import time

from host.initiator import KbtpClient, env_target

t0 = time.monotonic()
c = KbtpClient(env_target(), initiator_id=int(sys.argv[1]) if len(sys.argv) > 1 else 7)
s = c.session
print(f"HELLO_ACK features={s.features:#x} credits={s.request_credits} block={s.block_size} "
      f"inline={s.max_inline} quota={s.allocation_quota} handles={s.handle_base:#x}+"
      f"{s.handle_count} connect+hello={time.monotonic() - t0:.2f}s", flush=True)
c.goodbye()
print("DONE")
