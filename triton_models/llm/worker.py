"""A non-leader rank of the llm group: join the process group, follow rank 0 until told to stop.

Started by the local multinode backend (autoscaler/act/local/multinode.py) with
MIGSCALE_GROUP_RANK / MIGSCALE_GROUP_SIZE / MIGSCALE_GROUP_ADDR. It prints
"joined" once the group is formed so the supervisor can tell a member is up.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tp_mlp import Shard  # noqa: E402


def main() -> int:
    rank = int(os.environ["MIGSCALE_GROUP_RANK"])
    world = int(os.environ["MIGSCALE_GROUP_SIZE"])
    shard = Shard(rank, world, os.environ["MIGSCALE_GROUP_ADDR"], os.environ.get("MIGSCALE_DIST_BACKEND"))
    print(f"joined rank={rank} world={world} backend={shard.backend}", flush=True)
    try:
        while shard.follow_once():
            pass
    finally:
        shard.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
