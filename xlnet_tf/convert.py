"""Converts an original TF1 checkpoint or a HuggingFace XLNet directory into our format.

    python -m xlnet_tf.convert --input=xlnet_cased_L-24_H-1024_A-16 --output=xlnet-large-tf
    python -m xlnet_tf.convert --input=ckpt/xlnet_model.ckpt --config=ckpt/xlnet_config.json --output=out
    python -m xlnet_tf.convert --input=hf_dir --output=out            # config.json + model.safetensors/.bin

The output directory holds xlnet_model.ckpt (original variable names), xlnet_tf_config.json and
xlnet_config.json; it is written atomically, so an existing output is replaced only by a complete one.
"""

from __future__ import annotations

import argparse
import sys

from xlnet_tf.config import XLNetConfig


def convert(input_path: str, output_dir: str, config_path: str | None = None) -> str:
    from xlnet_tf import checkpoint
    from xlnet_tf.modeling import XLNetModel

    config = XLNetConfig.from_json_file(config_path) if config_path else None
    fmt = checkpoint.detect_format(input_path)
    model = XLNetModel.from_pretrained(input_path, config=config)
    model.save_pretrained(output_dir)
    return fmt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="original checkpoint (dir or prefix) or HF directory")
    parser.add_argument("--output", required=True, help="directory to write (our format)")
    parser.add_argument("--config", default=None, help="xlnet_config.json when it is not next to the input")
    args = parser.parse_args(argv)
    try:
        fmt = convert(args.input, args.output, args.config)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {fmt} checkpoint {args.input} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
