"""Converts between checkpoint formats: an original TF1 checkpoint, a HuggingFace XLNet directory or our format in;
our format or a HuggingFace directory out.

    python -m xlnet_tf.convert --input=xlnet_cased_L-24_H-1024_A-16 --output=xlnet-large-tf
    python -m xlnet_tf.convert --input=ckpt/xlnet_model.ckpt --config=ckpt/xlnet_config.json --output=out
    python -m xlnet_tf.convert --input=hf_dir --output=out            # config.json + model.safetensors/.bin
    python -m xlnet_tf.convert --input=out --output=hf_out --to=huggingface

Our format: xlnet_model.ckpt (original variable names), xlnet_tf_config.json and xlnet_config.json.
HuggingFace: config.json + model.safetensors, loaded by transformers' XLNetLMHeadModel / XLNetModel (a fine-tuned
run's head is written by the run scripts' --export_huggingface). The output is written atomically, so an existing
output is replaced only by a complete one.
"""

from __future__ import annotations

import argparse
import sys

from xlnet_tf import checkpoint
from xlnet_tf.config import XLNetConfig

FORMATS = {"xlnet_tf": "own", "huggingface": "huggingface"}


def convert(input_path: str, output_dir: str, config_path: str | None = None, to: str = "xlnet_tf") -> str:
    from xlnet_tf.modeling import XLNetModel

    if to not in FORMATS:
        raise ValueError(f"--to: expected one of {sorted(FORMATS)}, got {to!r}")
    fmt = checkpoint.detect_format(input_path)
    config = XLNetConfig.from_json_file(config_path) if config_path else checkpoint.resolve_config(
        input_path, fmt, None, {}, fix="pass --config=PATH (the model's xlnet_config.json)")
    model = XLNetModel.from_pretrained(input_path, config=config)
    model.save_pretrained(output_dir, format=FORMATS[to])
    return fmt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xlnet_tf.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="original checkpoint (dir or prefix), HF directory or ours")
    parser.add_argument("--output", required=True, help="directory to write")
    parser.add_argument("--config", default=None, help="xlnet_config.json when it is not next to the input")
    parser.add_argument("--to", default="xlnet_tf", choices=sorted(FORMATS),
                        help="output format: xlnet_tf (ours, default) or huggingface")
    args = parser.parse_args(argv)
    try:
        fmt = convert(args.input, args.output, args.config, args.to)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {fmt} checkpoint {args.input} -> {args.output} ({args.to})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
