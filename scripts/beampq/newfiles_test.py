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

"""Tests of beampq.newfiles: a file an earlier patch adds and later
patches change, kept in sdks/ as the series leaves it, built as each patch
leaves it."""

import shutil

import pytest

from beampq import Error
from beampq import check
from beampq import git
from beampq import refresh
from beampq import tree
from beampq.testing import MODULE_PATH
from beampq.testing import commit_in_tree
from beampq.testing import module_at
from beampq.testing import tree_git
from beampq.testing import tree_id

ADD_MOD = '0001-Python-Add-mod.patch'
CHANGE_MOD = '0003-Python-Change-mod-and-line-30.patch'
CHANGE_MOD_AGAIN = '0004-Python-Change-mod-again.patch'


def mod_in(repo, commit='HEAD') -> str:
  return git.output('show', f'{commit}:{MODULE_PATH}', cwd=repo) + '\n'


def changed_files(repo, commit) -> list[str]:
  return git.output(
      'show', '--format=', '--name-status', commit, cwd=repo).splitlines()


def test_a_later_patch_changes_a_file_an_earlier_one_adds(follow_up):
  project = follow_up
  assert [(p.name, p.new_files) for p in project.read_series().patches] == [
      (ADD_MOD, [MODULE_PATH]),
      ('0002-Python-Change-line-5.patch', []),
      (CHANGE_MOD, []),
      (CHANGE_MOD_AGAIN, []),
  ]
  assert 'diff --git' not in (project.patches / ADD_MOD).read_text()
  change = (project.patches / CHANGE_MOD).read_text()
  assert f'diff --git a/{MODULE_PATH} b/{MODULE_PATH}' in change
  assert '-module line 3\n+three\n' in change
  assert '-module line 15\n+fifteen\n' in change
  assert '+thirty\n' in change
  again = (project.patches / CHANGE_MOD_AGAIN).read_text()
  assert ' three\n-module line 4\n+four\n' in again
  # sdks/ shows the file as it stands at the end of the series.
  assert (project.root / MODULE_PATH).read_text() == module_at(4)
  edited = tree_id(project.tree)
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_id(project.tree) == edited
  # Each commit holds exactly its own change: the file as added, then the
  # later changes.
  assert mod_in(project.tree, 'HEAD~3') == module_at(1)
  assert mod_in(project.tree, 'HEAD~1') == module_at(3)
  assert mod_in(project.tree) == module_at(4)
  assert changed_files(project.tree, 'HEAD~3') == [f'A\t{MODULE_PATH}']
  assert changed_files(project.tree, 'HEAD~1') == [
      f'M\t{MODULE_PATH}', 'M\tsdks/python/apache_beam/util.py'
  ]
  assert changed_files(project.tree, 'HEAD') == [f'M\t{MODULE_PATH}']
  check.check(project)


def test_amends_round_trip_through_the_adding_and_the_later_patches(follow_up):
  project = follow_up
  change = (project.patches / CHANGE_MOD).read_text()
  # Amend the adding commit (line 10, away from the later changes) and the
  # last one (line 19), as a developer does.
  commit_in_tree(
      project,
      'fixup! [Python] Add mod',
      {MODULE_PATH: module_at(4).replace('module line 10\n', 'ten\n')})
  git.run(
      'rebase',
      '-q',
      '-i',
      '--autosquash',
      tree.BASE_TAG,
      cwd=project.tree,
      env={'GIT_SEQUENCE_EDITOR': 'true'})
  (project.tree / MODULE_PATH).write_text(
      mod_in(project.tree).replace('module line 19\n', 'nineteen\n'))
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  refresh.refresh(project)
  final = module_at(4).replace('module line 10\n', 'ten\n').replace(
      'module line 19\n', 'nineteen\n')
  assert (project.root / MODULE_PATH).read_text() == final
  assert [p.name for p in project.read_series().patches
          ][2:] == [CHANGE_MOD, CHANGE_MOD_AGAIN]
  assert '+nineteen' in (project.patches / CHANGE_MOD_AGAIN).read_text()
  made = (project.patches / CHANGE_MOD).read_text()
  assert 'ten' not in made and made != change, 'new index lines only'
  assert made.split('\n@@')[1:] == change.split('\n@@')[1:]
  check.check(project)
  edited = tree_id(project.tree)
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_id(project.tree) == edited
  assert mod_in(project.tree,
                'HEAD~3') == module_at(1).replace('module line 10\n', 'ten\n')
  assert mod_in(project.tree) == final


def test_a_hand_edited_new_file_must_agree_with_the_later_patches(
    follow_up, capsys):
  project = follow_up
  sdks = project.root / MODULE_PATH
  # Inside a later patch's hunk: the tree cannot be built from it.
  sdks.write_text(module_at(4).replace('four\n', 'FOUR\n'))
  with pytest.raises(Error) as raised:
    check.check(project)
  assert str(raised.value) == (
      f'patches/{CHANGE_MOD_AGAIN}, undone from {MODULE_PATH} (sdks/ holds '
      'each new file as the last patch that changes it leaves it), does not '
      f'apply: {MODULE_PATH} (hunk at line 1). If sdks/ was edited by hand, '
      'undo that (`git checkout -- sdks/`) and make the edit in build/beam, '
      'then refresh')
  with pytest.raises(Error, match=f'{CHANGE_MOD_AGAIN}, undone from'):
    tree.update(project, force=True)
  # Lines moved under a later patch's hunk: refused, as an offset is.
  sdks.write_text(
      module_at(4).replace('module line 9\n', 'module line 9\nnew line\n'))
  with pytest.raises(Error, match='applies only with an offset'):
    check.check(project)
  # Away from the hunks: the later patches no longer describe the tree.
  sdks.write_text(module_at(4).replace('module line 10\n', 'ten\n'))
  with pytest.raises(Error, match='check found 2 problems'):
    check.check(project)
  err = capsys.readouterr().err
  assert f'patches/{CHANGE_MOD} is stale' in err
  assert f'patches/{CHANGE_MOD_AGAIN} is stale' in err
  # tree takes the edit into the commit that adds the file, and refresh
  # brings the later patches up to date.
  tree.update(project)
  assert mod_in(project.tree,
                'HEAD~3') == module_at(1).replace('module line 10\n', 'ten\n')
  refresh.refresh(project)
  check.check(project)


@pytest.mark.parametrize(
    'adder, problems',
    [
        (CHANGE_MOD, [f'{CHANGE_MOD} changes {MODULE_PATH}, which it adds']),
        (
            CHANGE_MOD_AGAIN,
            [
                f'{CHANGE_MOD} changes {MODULE_PATH}, which '
                f'{CHANGE_MOD_AGAIN} adds later',
                f'{CHANGE_MOD_AGAIN} changes {MODULE_PATH}, which it adds',
            ]),
    ])
def test_only_later_patches_may_change_a_new_file(
    follow_up, capsys, adder, problems):
  project = follow_up
  text = project.series_file.read_text().replace(f'  + {MODULE_PATH}\n', '')
  project.series_file.write_text(
      text.replace(f'{adder}\n', f'{adder}\n  + {MODULE_PATH}\n'))
  with pytest.raises(Error, match=f'check found {len(problems)} problem'):
    check.check(project)
  err = capsys.readouterr().err
  for problem in problems:
    assert f'check: patches/{problem}: a patch holds no diff' in err
  with pytest.raises(Error, match=f'patches/{problems[0]}'):
    tree.update(project, force=True)
