"""python -m xlnet_tf.accel.kernels build [--force] | status

``build`` compiles only when there is no current build (``--force``: always).
"""

import sys

from xlnet_tf.accel import kernels


def main(argv) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "build":
        if "--force" not in argv[1:] and kernels.status().startswith("built"):
            print(kernels.status())
            return 0
        try:
            print(f"built {kernels.build()}")
        except RuntimeError as e:
            print(f"xlnet_tf.accel.kernels: {e}", file=sys.stderr)
            return 1
        return 0
    if cmd == "status":
        print(kernels.status())
        return 0
    print("usage: python -m xlnet_tf.accel.kernels build [--force] | status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
