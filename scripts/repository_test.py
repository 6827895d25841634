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

"""Rules for the repository as a whole, that no one module owns.

The README's test command is what CI runs: `.ci/run` ends with it, as the
README writes it, and does nothing before it that changes what it finds or
runs (the Pythons tox finds come from toxfile.py, for both).

Each non-test module of this repository's tooling (scripts/) and benchmark
(bench/) fits in 600 lines: one that grows past them holds more than one
concern, and is split.

Each pull request description (patches/pull-requests/*.md) has at most 500
words of prose, as a Beam reviewer reads it: its title, headings, code
blocks, tables, generated figure blocks and <details> blocks do not count.

The README's first 60 lines, the screen a newcomer reads, hold its two
commands (build the tree, run the tests) and its pipeline example (the
first python block after `<!-- readme-example -->`, which
readme_example_test.py runs on the patched tree).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The most lines a non-test module of scripts/ or bench/ may have.
MODULE_LINES = 600
# The most words of prose a pull request description may have.
DESCRIPTION_WORDS = 500
# The README's lines that must hold its commands and its example.
README_HEAD_LINES = 60
# The line above the README's example.
EXAMPLE_MARKER = '<!-- readme-example -->'


def _readme_command(readme: str, ending: str, what: str) -> str:
  """The one line of the README's shell blocks that ends with `ending`."""
  lines = [
      line.strip() for block in re.findall(r'```sh\n(.*?)```', readme, re.S)
      for line in block.splitlines()
  ]
  found = [line for line in lines if line.endswith(ending)]
  assert len(found) == 1, f'README.md: one {what} command, not {found}'
  return found[0]


def readme_test_command(readme: str) -> str:
  """The README's command that runs the default tox envs."""
  return _readme_command(readme, '-m tox', 'test')


def readme_tree_command(readme: str) -> str:
  """The README's command that builds the patched tree."""
  return _readme_command(readme, '-m tox -e tree', 'tree')


def readme_example(readme: str) -> str:
  """The README's pipeline example: the code of the first python block
  after the EXAMPLE_MARKER line."""
  at = readme.find(EXAMPLE_MARKER + '\n')
  assert at >= 0, f'README.md: no {EXAMPLE_MARKER} line above the example'
  block = re.compile(r'^```python\n(.*?)^```$', re.S | re.M).search(readme, at)
  assert block, f'README.md: no python block after {EXAMPLE_MARKER}'
  return block.group(1)


def head_problems(readme: str, lines: int = README_HEAD_LINES) -> list[str]:
  """What the README's first lines lack of its commands and its example."""
  head = ''.join(readme.splitlines(keepends=True)[:lines])
  problems = []
  shell = [
      line.strip() for block in re.findall(r'```sh\n(.*?)```', head, re.S)
      for line in block.splitlines()
  ]
  for command in (readme_tree_command(readme), readme_test_command(readme)):
    if command not in shell:
      problems.append(
          f'the command {command!r} is not in a shell block of the first '
          f'{lines} lines')
  if f'```python\n{readme_example(readme)}```' not in head:
    problems.append(f'the example does not end within the first {lines} lines')
  return problems


def test_the_readmes_first_lines_hold_its_commands_and_example():
  assert head_problems((ROOT / 'README.md').read_text()) == []


def test_a_readme_whose_example_or_commands_come_late_fails():
  commands = (
      '```sh\npython3 -m pip install tox && python3 -m tox -e tree\n'
      'python3 -m pip install tox && python3 -m tox\n```\n')
  example = f'{EXAMPLE_MARKER}\n```python\nprint(1)\nprint(2)\n```\n'
  assert head_problems(commands + example, lines=9) == []
  assert readme_example(commands + example) == 'print(1)\nprint(2)\n'
  late_example = head_problems(commands + example, lines=8)
  assert late_example == ['the example does not end within the first 8 lines']
  late_commands = head_problems('text\n' * 3 + example + commands, lines=8)
  assert late_commands == [
      "the command 'python3 -m pip install tox && python3 -m tox -e tree' "
      'is not in a shell block of the first 8 lines',
      "the command 'python3 -m pip install tox && python3 -m tox' is not in "
      'a shell block of the first 8 lines',
  ]
  with pytest.raises(AssertionError, match='no <!-- readme-example --> line'):
    readme_example(commands + '```python\nprint(1)\n```\n')


def script_commands(script: str) -> list[str]:
  """A shell script's lines that are not blank or comments."""
  return [
      line.strip() for line in script.splitlines()
      if line.strip() and not line.strip().startswith('#')
  ]


def ci_problems(readme: str, ci: str) -> list[str]:
  """Where CI's script departs from the README's test command."""
  command = readme_test_command(readme)
  commands = script_commands(ci)
  problems = []
  if commands[-1:] != [command]:
    problems.append(
        f'.ci/run ends with {commands[-1:]}, not the README\'s {command!r}')
  for line in commands[:-1]:
    if re.search(r'\bexport\b|\bPATH\b|PYENV|^\w+=|\s\w+=\S', line):
      problems.append(f'.ci/run changes the environment: {line!r}')
    if re.search(r'-m tox\b', line) and '--notest' not in line:
      problems.append(f'.ci/run runs tox other than the README: {line!r}')
  return problems


def test_ci_runs_the_readmes_test_command():
  readme = (ROOT / 'README.md').read_text()
  ci = (ROOT / '.ci' / 'run').read_text()
  assert ci_problems(readme, ci) == []


README = '''\
```sh
python3 -m pip install tox && python3 -m tox -e tree
# the tests
python3 -m pip install tox && python3 -m tox
```
'''


def test_a_ci_that_departs_from_the_readme_fails():
  readme_command = 'python3 -m pip install tox && python3 -m tox'
  assert ci_problems(README, f'set -e\n{readme_command}\n') == []
  assert ci_problems(README, 'python3 -m tox\n') == [
      f".ci/run ends with ['python3 -m tox'], not the README's "
      f'{readme_command!r}'
  ]
  assert ci_problems(
      README,
      'PATH="$PATH:/root/.pyenv/versions/3.10.13/bin"\nexport PATH\n'
      f'{readme_command}\n') == [
          '.ci/run changes the environment: '
          '\'PATH="$PATH:/root/.pyenv/versions/3.10.13/bin"\'',
          ".ci/run changes the environment: 'export PATH'",
      ]
  assert ci_problems(
      README,
      'python3 -m tox run-parallel --notest\npython3 -m tox -e py311\n'
      f'{readme_command}\n') == [
          ".ci/run runs tox other than the README: 'python3 -m tox -e py311'"
      ]


def oversized_modules(folder: Path, limit: int = MODULE_LINES) -> list[str]:
  """The non-test modules under folder (its packages included) that have
  more than limit lines, with their line counts."""
  found = []
  for path in sorted(folder.rglob('*.py')):
    if path.name.endswith('_test.py') or '__pycache__' in path.parts:
      continue
    lines = len(path.read_text().splitlines())
    if lines > limit:
      found.append(f'{path.relative_to(folder.parent)}: {lines} lines')
  return found


def test_every_module_of_scripts_and_bench_fits_in_600_lines():
  assert oversized_modules(ROOT / 'scripts') + oversized_modules(
      ROOT / 'bench') == []


def test_a_module_past_the_limit_is_named(tmp_path):
  tool = tmp_path / 'tool'
  (tool / 'pkg').mkdir(parents=True)
  for name, lines in (('fits.py', 600), ('big.py', 601), ('big_test.py', 900),
                      ('pkg/deep.py', 700)):
    (tool / name).write_text('x = 1\n' * lines)
  assert oversized_modules(tool) == [
      'tool/big.py: 601 lines',
      'tool/pkg/deep.py: 700 lines',
  ]


def prose_words(description: str) -> int:
  """The words of a pull request description that a reader reads as prose:
  not its title, headings, code blocks, tables, HTML comments (the figure
  blocks' markers among them), generated figure blocks or <details>."""
  text = re.sub(r'```.*?```', '', description, flags=re.S)
  text = re.sub(r'<details>.*?</details>', '', text, flags=re.S)
  text = re.sub(r'<!-- (bench:[\w-]+) -->.*?<!-- /\1 -->', '', text, flags=re.S)
  text = re.sub(r'<!--.*?-->', '', text, flags=re.S)
  return sum(
      len(line.split()) for line in text.splitlines()
      if not line.lstrip().startswith(('|', '#')))


def test_every_pull_request_description_has_at_most_500_words_of_prose():
  long = {
      path.name: words
      for path in sorted((ROOT / 'patches' / 'pull-requests').glob('*.md'))
      if (words := prose_words(path.read_text())) > DESCRIPTION_WORDS
  }
  assert not long, f'more than {DESCRIPTION_WORDS} words of prose: {long}'


def test_prose_words_leave_out_what_is_not_prose():
  description = '\n'.join([
      '# A title of five words',
      'One two three.',
      '## A heading',
      '```python',
      'code = not + prose',
      '```',
      '| a | table |',
      '<!-- bench:pr-x -->',
      'generated figures here',
      '<!-- /bench:pr-x -->',
      '<details><summary>script</summary>',
      'hidden words',
      '</details>',
      'Four more words here.',
  ])
  assert prose_words(description) == 7
  assert prose_words('word ' * (DESCRIPTION_WORDS + 1)) > DESCRIPTION_WORDS
