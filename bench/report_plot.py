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

"""The report's plot, from results.json alone: per deployment and
workload, the default's ratio over the baseline against R (one line per
decode length), with its bound."""

from pathlib import Path

from bench import v4

WORKLOADS = ('W0', 'W1', 'W2', 'W3', 'W4')


def plot(results, out: Path) -> list[Path]:
  """v4.png; nothing without matplotlib or phase A."""
  try:
    import matplotlib
  except ImportError:
    return []
  section = results.get('v4', {})
  if 'streaming_F3' not in section:
    return []
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  deployments = [d for d in v4.DEPLOYMENTS if d in section]
  fig, axes = plt.subplots(
      len(deployments),
      len(WORKLOADS),
      figsize=(3 * len(WORKLOADS), 2.6 * len(deployments)),
      sharey=True,
      squeeze=False)
  r_values = {f'R{k}': value for k, value in v4.RATIOS.items()}
  for i, dep in enumerate(deployments):
    for j, workload in enumerate(WORKLOADS):
      ax = axes[i][j]
      by_r = section[dep].get(workload, {})
      for d_key, style in (('D0', '-'), ('D64', '--'), ('D256', ':')):
        xs, ys, bounds = [], [], []
        for r_key in sorted(by_r, key=lambda r: r_values[r]):
          point = by_r[r_key].get(d_key)
          if point is None:
            continue
          xs.append(r_values[r_key])
          ys.append(point['default']['ratio'])
          bounds.append(point['bound']['ratio'])
        if xs:
          ax.plot(
              xs, ys, style, marker='o', color='C0', label=f'default {d_key}')
          ax.plot(
              xs, bounds, style, marker='x', color='C2', label=f'bound {d_key}')
      ax.axhline(1.0, color='grey', lw=0.8)
      ax.axhline(0.97, color='red', lw=0.6, ls=':')
      ax.set_xscale('log')
      ax.set_title(f'{dep} {workload}', fontsize=8)
      ax.tick_params(labelsize=7)
      if i == len(deployments) - 1:
        ax.set_xlabel('R = S / C', fontsize=7)
      if j == 0:
        ax.set_ylabel('ratio over baseline', fontsize=7)
  axes[0][0].legend(fontsize=5)
  fig.tight_layout()
  path = out / 'v4.png'
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return [path]
