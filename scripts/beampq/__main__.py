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

"""The command line: `python -m beampq <action>`, one function per action.

  fetch       download the pinned sdist (patches/base.cfg), check sha256
  tree        import the queue as commits: build/beam is a git repository
              shaped like a Beam checkout whose first commit (tag `base`)
              is the sdist and which has one commit per patch
  refresh     write the commits of build/beam back to patches/, sdks/ and
              the series, after editing them there (commit, amend, rebase -i)
  check       fail when patches/, sdks/, the series, the pull request
              descriptions, CHANGES.md and the tree disagree
  apply       apply the queue to a Beam checkout (git am -3 -k) and add our
              CHANGES.md entries to its Unreleased section
  export      write one folder per upstream pull request

and the gates, on build/beam as it is (uncommitted work included):

  test        Beam's pytest setup on the test modules the queue touches
  regression  the wider suites; failures compared with the base
  lint        ruff and pyrefly (ratchet against the base), yapf --diff and
              the unittest.main check, as Beam's lint env runs them
  pylint      pylint with Beam's legacy .pylintrc settings (ratchet)
  mypy        mypy with Beam's legacy mypy.ini settings (ratchet)
  format      yapf and ruff's import sorting in place, in the tree
  differential
              unkeyed BatchElements pipelines on the base and on the
              patched tree, their outputs compared

Errors are one line on stderr and a non-zero exit; no action leaves a tree
that a later run would trust when it fails half way.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

from beampq import Error
from beampq import check
from beampq import refresh
from beampq import sdist
from beampq import tree
from beampq import upstream
from beampq.gates import differential as differential_gate
from beampq.gates import lint
from beampq.gates import suite
from beampq.gates.workspace import Workspace
from beampq.project import ROOT
from beampq.project import Project


def fetch(project: Project, args: argparse.Namespace) -> int:
  sdist.fetch(project, args.source)
  return 0


def tree_(project: Project, args: argparse.Namespace) -> int:
  tree.update(project, force=args.force)
  return 0


def refresh_(project: Project, args: argparse.Namespace) -> int:
  refresh.refresh(project, force=args.force)
  return 0


def check_(project: Project, args: argparse.Namespace) -> int:
  check.check(project)
  return 0


def apply(project: Project, args: argparse.Namespace) -> int:
  upstream.apply(project, args.checkout)
  return 0


def export(project: Project, args: argparse.Namespace) -> int:
  upstream.export(project, args.dest, args.pull_request)
  return 0


def _pytest_args(args: argparse.Namespace) -> list[str]:
  return [a for a in args.pytest_args if a != '--']


def test(project: Project, args: argparse.Namespace) -> int:
  if args.heads:
    return suite.heads(Workspace.open(project), _pytest_args(args))
  return suite.run(Workspace.open(project), _pytest_args(args), args.series)


def regression(project: Project, args: argparse.Namespace) -> int:
  return suite.regression(Workspace.open(project), _pytest_args(args))


def lint_(project: Project, args: argparse.Namespace) -> int:
  return lint.lint(Workspace.open(project))


def pylint(project: Project, args: argparse.Namespace) -> int:
  return lint.pylint(Workspace.open(project))


def mypy(project: Project, args: argparse.Namespace) -> int:
  return lint.mypy(Workspace.open(project))


def format_(project: Project, args: argparse.Namespace) -> int:
  return lint.format_files(Workspace.open(project))


def differential(project: Project, args: argparse.Namespace) -> int:
  return differential_gate.run(Workspace.open(project), args.select)


def parser() -> argparse.ArgumentParser:
  assert __doc__ is not None
  root = argparse.ArgumentParser(
      prog='beampq',
      description=__doc__.split('\n\n', 1)[1],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  root.add_argument(
      '--project',
      type=Path,
      default=ROOT,
      help='the patch-set repository (default: the one holding beampq)')
  actions = root.add_subparsers(dest='action', required=True)

  def action(name, function, help_text):
    sub = actions.add_parser(name, help=help_text)
    sub.set_defaults(function=function)
    return sub

  action('fetch', fetch, 'download and verify the base').add_argument(
      '--from',
      dest='source',
      type=Path,
      help='use this local copy of the sdist instead of the index')
  action('tree', tree_, 'build build/beam').add_argument(
      '--force',
      action='store_true',
      help='rebuild even if build/beam has work not in patches/')
  action('refresh', refresh_,
         'write patches/ and sdks/ from the tree').add_argument(
             '--force',
             action='store_true',
             help='overwrite patches/ and sdks/ changed since the tree was '
             'built')
  action('check', check_, 'fail when the queue is inconsistent')
  action('apply', apply, 'apply to a Beam checkout').add_argument(
      'checkout', type=Path)
  export_parser = action('export', export, 'one folder per pull request')
  export_parser.add_argument('dest', type=Path)
  export_parser.add_argument(
      '--pull-request',
      action='append',
      metavar='NAME',
      help='only this pull request of the series (repeatable)')
  test_parser = action('test', test, 'pytest on the patched tree')
  test_parser.add_argument(
      '--series',
      action='store_true',
      help='only the tests the queue adds or changes in the test modules')
  test_parser.add_argument(
      '--heads',
      action='store_true',
      help='those tests, up to each pull request before the last, on the '
      'tree at its head')
  test_parser.add_argument('pytest_args', nargs=argparse.REMAINDER)
  action('regression', regression,
         'the wider suites, compared with the base').add_argument(
             'pytest_args', nargs=argparse.REMAINDER)
  for name, function in (('lint', lint_), ('pylint', pylint), ('mypy', mypy),
                         ('format', format_)):
    action(name, function, f'{name} on the files the queue touches')
  action(
      'differential',
      differential,
      'unkeyed BatchElements: the base and the patched tree compared'
  ).add_argument(
      '-k',
      dest='select',
      metavar='TEXT',
      help='only the cases whose name (config/runner) contains TEXT')
  return root


def main(argv: Optional[list[str]] = None) -> int:
  args = parser().parse_args(argv)
  try:
    return args.function(Project(args.project), args)
  except Error as e:
    print(f'beampq: error: {e}', file=sys.stderr)
    return 1


if __name__ == '__main__':
  sys.exit(main())
