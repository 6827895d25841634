#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""Tuning AdaptiveNumShards on benchmark v4, on the tuning seeds only.

Phase A's tasks for the tuning workloads (W1, W2, W3) at R0_25 and R4, on
two of the tuning seeds, with the tree's AdaptiveNumShards built from the
given keyword arguments; writes the default's median ratio over its
deployment's baseline at every point. Run it on the patched tree (the
bench-tree env's Python, PYTHONPATH=build/beam/sdks/python), one variant
per process:

  python -m bench.research_v4 run NAME '{"run_batches": 1}' --out DIR
  python -m bench.research_v4 table DIR NAME ...

`table` prints the variants side by side (bench/RESEARCH.md quotes it).
"""

import argparse
import collections
import json
import statistics
from pathlib import Path

from bench import costs
from bench import v4

SEEDS = [40905, 40906]
R_KEYS = ('0_25', '4')
WORKLOADS = ('W1', 'W2', 'W3')
GOAL = 0.97


def run(kwargs: dict, groups=('streaming', 'batch')) -> dict:
  """{point: the default's median ratio} for AdaptiveNumShards(**kwargs)."""
  from apache_beam.transforms.util import AdaptiveNumShards
  v4.EVAL_SEEDS = SEEDS
  v4.r_keys = lambda workload_name, quick=False: R_KEYS
  chosen = [w for w in v4.WORKLOADS if w.name in WORKLOADS]
  done = v4.run_all(
      AdaptiveNumShards(**kwargs),
      costs.GPU,
      False, lambda message: None,
      processes=1,
      chosen=chosen,
      groups=groups)
  ratios = collections.defaultdict(list)
  for task in done:
    _, workload, r_key, _ = task['task']
    for deployment, figures in task['deployments'].items():
      window = 'whole' if deployment == 'batch' else '10s'
      for decode, arms in figures['figures'].items():
        if 'baseline' not in arms or 'default' not in arms:
          continue
        for base, default in zip(arms['baseline'], arms['default']):
          ratios[f'{deployment}.{workload}.R{r_key}.D{decode}'].append(
              default['capacity'][window] / base['capacity'][window])
  return {k: statistics.median(v) for k, v in sorted(ratios.items())}


def table(results: dict) -> str:
  names = list(results)
  lines = [
      '| point | ' + ' | '.join(names) + ' |',
      '|---|' + '---|' * len(names),
  ]
  for point in results[names[0]]:
    lines.append(
        f'| {point} | ' + ' | '.join(f'{results[n][point]:.2f}'
                                     for n in names) + ' |')
  lines.append(
      f'| below {GOAL} | ' + ' | '.join(
          str(sum(1 for r in results[n].values() if r < GOAL))
          for n in names) + ' |')
  lines.append(
      '| geometric mean | ' + ' | '.join(
          f'{statistics.geometric_mean(results[n].values()):.3f}'
          for n in names) + ' |')
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m bench.research_v4')
  sub = parser.add_subparsers(dest='command', required=True)
  one = sub.add_parser('run')
  one.add_argument('name')
  one.add_argument('kwargs', type=json.loads)
  one.add_argument('--out', type=Path, default=Path('build/research_v4'))
  one.add_argument(
      '--groups',
      nargs='+',
      default=['streaming', 'batch'],
      choices=['streaming', 'batch'],
      help='the deployments to run: streaming (F2 and F3), batch')
  both = sub.add_parser('table')
  both.add_argument('dir', type=Path)
  both.add_argument('names', nargs='+')
  args = parser.parse_args(argv)
  if args.command == 'run':
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f'{args.name}.json').write_text(
        json.dumps({
            'kwargs': args.kwargs,
            'groups': args.groups,
            'ratios': run(args.kwargs, tuple(args.groups))
        },
                   indent=1))
  else:
    print(
        table({
            n: json.loads((args.dir / f'{n}.json').read_text())['ratios']
            for n in args.names
        }))
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
