"""`hpcsec config check FILE`: validate a site config before deploying it.

Prints `ok` and exits 0 when the file is valid; otherwise the command line prints
`FILE:LINE: what is wrong` and exits 2 (a ConfigError, like every other user error). The
config is checked against the rules it is for (`--rules`, default the bundled ones): a
`lists:` or `thresholds:` name none of them uses is a typo, reported with the closest name.
`hpcsec config show FILE` prints what the rules will see: the placeholder values (site lists
merged over the defaults), the assets and the maintenance windows.
"""

from __future__ import annotations

import argparse
import sys

from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.display import visible_json
from hpcsec.detector.engine import rulecache
from hpcsec.detector.engine.config_names import config_name_errors
from hpcsec.detector.engine.loader import load_rules


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate or show a site config")
    actions = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a site config (exit 2 on errors)")
    check.add_argument("file", metavar="FILE")
    check.add_argument(
        "--rules",
        action="append",
        metavar="DIR|FILE",
        help="rules the config is for (repeatable; default: the bundled rules): a list or "
        "threshold none of them uses is an error",
    )
    check.set_defaults(func=run_check)
    show = actions.add_parser("show", help="print the effective policy of a site config")
    show.add_argument("file", metavar="FILE")
    show.set_defaults(func=run_show)


def run_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    # through the rule cache: the names are checked against the rules' headers, with no
    # pySigma parse when the same rules and thresholds were loaded before
    ruleset = load_rules(
        args.rules,
        with_tests=False,
        threshold_values=config.thresholds,
        cache=rulecache.default_dir(),
    )
    errors = config_name_errors(config, ruleset.rules)
    for error in errors[1:]:  # the entry point prints the first and exits 2
        print(f"hpcsec: error: {error}", file=sys.stderr)
    if errors:
        raise errors[0]
    print("ok")
    return 0


def effective_policy(config: SiteConfig) -> dict:
    return {
        "node_class": config.node_class,
        "assets": [
            {
                "name": a.name,
                "kind": a.kind,
                "paths": list(a.paths),
                "readers": {"users": list(a.readers.users), "accounts": list(a.readers.accounts)},
                "writers": {"users": list(a.writers.users), "accounts": list(a.writers.accounts)},
            }
            for a in config.assets
        ],
        "admins": list(config.admins.users),
        "gpu_services": list(config.gpu_services),
        "maintenance": [
            {"start": w.start.isoformat(), "end": w.end.isoformat(), "hosts": list(w.hosts)}
            for w in config.maintenance
        ],
        "firmware": {
            "baselines": config.firmware.baselines,
            "vulnerable": {k: list(v) for k, v in config.firmware.vulnerable.items()},
        },
        "placeholders": config.placeholders(),
    }


def run_show(args: argparse.Namespace) -> int:
    import orjson  # here, not at the top: `config check` has no use for its import

    config = load_config(args.file)
    policy = orjson.dumps(
        effective_policy(config), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    )
    sys.stdout.buffer.write(visible_json(policy))
    sys.stdout.write("\n")
    return 0
