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

"""Tests of beampq.queue: importing the queue as commits, refreshing
patches/ from them, and checking that the two agree."""

import shutil

import pytest

from beampq import Error
from beampq import git
from beampq import queue
from beampq import testing
from beampq import upstream
from beampq.project import Project
from beampq.testing import MODULE_PATH
from beampq.testing import UTIL
from beampq.testing import commit_in_tree
from beampq.testing import module_at
from beampq.testing import tree_git
from beampq.testing import tree_id

FIRST = '0001-Python-Change-line-5.patch'
SECOND = '0002-Python-Add-a-module.patch'

# --------------------------------------------------------------------------
# Import: build/beam from the queue.


def test_tree_has_the_base_then_one_commit_per_patch(project):
  subjects = tree_git(project, 'log', '--reverse', '--format=%s').splitlines()
  assert subjects == [
      'apache-beam 9.9.0 sdist (the base)',
      '[Python] Change line 5',
      '[Python] Add a module',
  ]
  assert tree_git(project, 'rev-parse',
                  'HEAD~2') == tree_git(project, 'rev-parse', queue.BASE_TAG)
  assert (project.tree / 'sdks/python/setup.cfg').read_text() == '[yapf]\n'
  added = tree_git(
      project, 'show', '--name-only', '--diff-filter=A', '--format=', 'HEAD')
  assert added.split() == [
      'sdks/python/apache_beam/new_mod.py',
      'sdks/python/apache_beam/new_mod_test.py',
  ]


def test_tree_commits_are_the_users_and_dated_as_what_they_hold(project):
  queue.update(project, force=True)
  log = tree_git(project, 'log', '--reverse',
                 '--format=%an|%cn|%ce|%at|%ct').splitlines()
  base, *patches = [line.split('|') for line in log]
  assert base == [
      'Test Committer',
      'Test Committer',
      'committer@example.com',
      str(testing.RELEASED),
      str(testing.RELEASED),
  ]
  for author, committer, _, authored, committed in patches:
    assert (author, committer) == ('Test Author', 'Test Committer')
    assert committed == authored, 'committed when the patch is dated'


def test_the_projects_identity_commits(project, tmp_path, monkeypatch):
  # The user set their identity in their clone of the patch set only, and
  # runs beampq from elsewhere: tree, refresh and export commit as them.
  commit_in_tree(
      project,
      '[Python] Change line 9',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 9\n', 'x\n')},
      env={'GIT_AUTHOR_NAME': 'Someone Else'})
  testing.forget_identity(monkeypatch, tmp_path)
  git.run('init', '-q', cwd=project.root)
  git.run('config', 'user.name', 'Ada', cwd=project.root)
  git.run('config', 'user.email', 'ada@example.org', cwd=project.root)
  monkeypatch.chdir(tmp_path)
  queue.refresh(project)
  assert tree_git(
      project, 'log', '--format=%an <%ae>|%cn',
      f'{queue.BASE_TAG}..').splitlines() == ['Ada <ada@example.org>|Ada'] * 3
  queue.build(project, tmp_path / 'beam', quiet=True)
  assert set(
      git.output('log', '--format=%an|%cn',
                 cwd=tmp_path / 'beam').splitlines()) == {'Ada|Ada'}
  upstream.export(project, tmp_path / 'out')
  for patch in (tmp_path / 'out').rglob('*.patch'):
    assert 'From: Ada <ada@example.org>' in patch.read_text()


def test_rebuilt_tree_equals_the_refreshed_one(project):
  edited = tree_id(project.tree)
  queue.update(project, force=True)
  assert tree_id(project.tree) == edited
  queue.check(project)


def test_tree_is_reproducible_and_a_no_op_when_current(project, capsys):
  queue.update(project, force=True)
  rebuilt = tree_git(project, 'rev-parse', 'HEAD')
  capsys.readouterr()
  queue.update(project)
  assert 'up to date' in capsys.readouterr().out
  assert tree_git(project, 'rev-parse', 'HEAD') == rebuilt
  queue.update(project, force=True)
  assert tree_git(project, 'rev-parse', 'HEAD') == rebuilt


def test_tree_keeps_local_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='has work that is not in patches'):
    queue.update(project)
  assert tree_git(project, 'log', '-1', '--format=%s') == 'More'
  assert queue.update(project, local_work_ok=True) == project.tree
  assert tree_git(project, 'log', '-1', '--format=%s') == 'More'
  queue.update(project, force=True)
  assert tree_git(
      project, 'log', '-1', '--format=%s') == '[Python] Add a module'


def test_tree_state_is_the_one_answer_to_is_it_current(project):
  state = queue.tree_state(project)
  assert state.current and not state.local_work
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  state = queue.tree_state(project)
  assert not state.current
  assert state.local_work == [
      '1 uncommitted changes (M sdks/python/apache_beam/util.py)'
  ]
  tree_git(project, 'checkout', '--', '.')
  assert queue.tree_state(project).current
  (project.root / 'sdks/python/apache_beam/new_mod.py').write_text('X = 2\n')
  state = queue.tree_state(project)
  assert not state.current and not state.local_work, 'patches/ moved on'
  shutil.rmtree(project.tree)
  assert queue.tree_state(project) == queue.TreeState(None, [], False)


def test_pull_request_lines_do_not_make_the_tree_stale(project):
  testing.start_pull_request(project, 'extra', SECOND)
  project.series_file.write_text(
      project.series_file.read_text().replace('[feature]\n', ''))
  assert queue.tree_state(project).current


def test_a_patch_that_does_not_apply_fails_and_leaves_no_tree(project):
  patch = project.patches / SECOND
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  shutil.rmtree(project.tree)
  with pytest.raises(Error) as raised:
    queue.update(project)
  assert f'{SECOND} does not apply' in str(raised.value)
  assert 'sdks/python/apache_beam/util.py' in str(raised.value)
  assert not project.tree.exists()
  assert [p.name for p in project.build.iterdir()] == ['cache']


def test_a_failed_rebuild_keeps_the_previous_tree(project):
  head = tree_git(project, 'rev-parse', 'HEAD')
  patch = project.patches / SECOND
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  with pytest.raises(Error, match='does not apply'):
    queue.update(project)
  assert tree_git(project, 'rev-parse', 'HEAD') == head
  with pytest.raises(Error, match='does not apply'):
    queue.update(project)


def test_a_patch_that_needs_an_offset_is_refused(project, tmp_path, index):
  moved = testing.make_sdist({
      'apache_beam/__init__.py': '',
      'apache_beam/util.py': 'extra\nextra\n' + UTIL,
      'setup.cfg': '[yapf]\n',
  })
  index.publish('apache_beam-9.9.0.tar.gz', moved)
  other = testing.make_project(tmp_path / 'other', sdist=moved)
  shutil.copy(project.patches / FIRST, other.patches)
  other.series_file.write_text(f'[fix]\n{FIRST}\n')
  with pytest.raises(Error, match='applies only with an offset'):
    queue.update(other)


def test_a_missing_patch_or_new_file_is_named(project):
  shutil.rmtree(project.tree)
  (project.root / 'sdks/python/apache_beam/new_mod.py').unlink()
  with pytest.raises(Error,
                     match='lists sdks/python/apache_beam/new_mod'
                     f'.py under {SECOND}, but'):
    queue.update(project)
  (project.patches / FIRST).unlink()
  with pytest.raises(Error,
                     match=f'names patches/{FIRST}, which does not exist'):
    queue.update(project)
  assert not project.tree.exists()


# --------------------------------------------------------------------------
# Refresh: patches/, sdks/ and the series from build/beam's commits.


def test_refresh_writes_patches_series_and_new_files(project):
  series = project.read_series()
  assert [(pr.name, [p.name for p in pr.patches])
          for pr in series.pull_requests] == [('fix', [FIRST]),
                                              ('feature', [SECOND])]
  assert series.patches[1].new_files == [
      'sdks/python/apache_beam/new_mod.py',
      'sdks/python/apache_beam/new_mod_test.py',
  ]
  second = (project.patches / SECOND).read_text()
  assert 'Subject: [PATCH] [Python] Add a module' in second
  assert '+thirty' in second
  assert 'new_mod' not in second, 'new files travel in sdks/, not patches'
  assert (project.root /
          'sdks/python/apache_beam/new_mod.py').read_text() == 'NEW = 1\n'


def test_refresh_makes_the_refresher_the_author(project):
  dated = '2025-03-04T05:06:07+00:00'
  commit_in_tree(
      project,
      '[Python] Change line 9',
      {
          'sdks/python/apache_beam/util.py': (
              project.tree /
              'sdks/python/apache_beam/util.py').read_text().replace(
                  'line 9\n', 'nine\n')
      },
      env={
          'GIT_AUTHOR_NAME': 'Someone Else',
          'GIT_AUTHOR_EMAIL': 'else@example.com',
          'GIT_AUTHOR_DATE': dated
      })
  queue.refresh(project)
  third = (project.patches / '0003-Python-Change-line-9.patch').read_text()
  assert 'From: Test Author <author@example.com>' in third
  assert 'Date: Tue, 4 Mar 2025 05:06:07 +0000' in third
  assert tree_git(project, 'log', '-1', '--format=%an') == 'Test Author'
  queue.check(project)


def test_refresh_keeps_each_patch_in_its_pull_request(project):
  # Reword the first patch of `feature` and add a commit after it: the
  # reworded patch stays in `feature` (same diff) and the new one joins it.
  tree_git(project, 'commit', '-q', '--amend', '-m', '[Python] Add new_mod')
  commit_in_tree(
      project, '[Python] Add x', {'sdks/python/apache_beam/x.py': 'X\n'})
  queue.refresh(project)
  assert [
      (pr.name, [p.name for p in pr.patches])
      for pr in project.read_series().pull_requests
  ] == [
      ('fix', [FIRST]),
      ('feature', ['0002-Python-Add-new_mod.patch', '0003-Python-Add-x.patch']),
  ]
  queue.check(project)


def test_refresh_refuses_a_pull_request_split_in_two(project):
  # A commit moved (here: copied) from `fix` to after `feature`.
  commit_in_tree(
      project,
      '[Python] Change line 5',
      {
          'sdks/python/apache_beam/util.py': (
              project.tree /
              'sdks/python/apache_beam/util.py').read_text().replace(
                  'line 6\n', 'six\n')
      })
  with pytest.raises(Error, match='belongs to pull request \\[fix\\]'):
    queue.refresh(project)
  queue.update(project, force=True)
  queue.check(project)


def test_refresh_needs_a_pull_request(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path)
  project.series_file.write_text('')
  queue.update(project)
  commit_in_tree(project, 'Change', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='the series names no pull request'):
    queue.refresh(project)


def test_amended_commit_round_trips(project):
  tree_git(project, 'rebase', '-q', '--exec', 'true', queue.BASE_TAG)
  (project.tree / 'sdks/python/apache_beam/new_mod.py').write_text('NEW = 2\n')
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  queue.refresh(project)
  assert (project.root /
          'sdks/python/apache_beam/new_mod.py').read_text() == 'NEW = 2\n'
  queue.check(project)


def test_refresh_refuses_a_dirty_tree(project):
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  with pytest.raises(Error, match='uncommitted changes'):
    queue.refresh(project)


def test_refresh_refuses_an_operation_in_progress(project):
  tree_git(project, 'checkout', '-q', '-b', 'other', 'HEAD~1')
  commit_in_tree(
      project,
      'Conflicting',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 30\n', 'x\n')})
  assert git.attempt('cherry-pick', 'main', cwd=project.tree).returncode != 0
  with pytest.raises(Error, match='a cherry-pick is in progress'):
    queue.refresh(project)


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
  queue.update(project)
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
  queue.check(project)


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
      queue.BASE_TAG,
      cwd=project.tree,
      env={'GIT_SEQUENCE_EDITOR': 'true'})
  (project.tree / MODULE_PATH).write_text(
      mod_in(project.tree).replace('module line 19\n', 'nineteen\n'))
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  queue.refresh(project)
  final = module_at(4).replace('module line 10\n', 'ten\n').replace(
      'module line 19\n', 'nineteen\n')
  assert (project.root / MODULE_PATH).read_text() == final
  assert [p.name for p in project.read_series().patches
          ][2:] == [CHANGE_MOD, CHANGE_MOD_AGAIN]
  assert '+nineteen' in (project.patches / CHANGE_MOD_AGAIN).read_text()
  made = (project.patches / CHANGE_MOD).read_text()
  assert 'ten' not in made and made != change, 'new index lines only'
  assert made.split('\n@@')[1:] == change.split('\n@@')[1:]
  queue.check(project)
  edited = tree_id(project.tree)
  shutil.rmtree(project.tree)
  queue.update(project)
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
    queue.check(project)
  assert str(raised.value) == (
      f'patches/{CHANGE_MOD_AGAIN}, undone from {MODULE_PATH} (sdks/ holds '
      'each new file as the last patch that changes it leaves it), does not '
      f'apply: {MODULE_PATH} (hunk at line 1)')
  with pytest.raises(Error, match=f'{CHANGE_MOD_AGAIN}, undone from'):
    queue.update(project, force=True)
  # Lines moved under a later patch's hunk: refused, as an offset is.
  sdks.write_text(
      module_at(4).replace('module line 9\n', 'module line 9\nnew line\n'))
  with pytest.raises(Error, match='applies only with an offset'):
    queue.check(project)
  # Away from the hunks: the later patches no longer describe the tree.
  sdks.write_text(module_at(4).replace('module line 10\n', 'ten\n'))
  with pytest.raises(Error, match='check found 2 problems'):
    queue.check(project)
  err = capsys.readouterr().err
  assert f'patches/{CHANGE_MOD} is stale' in err
  assert f'patches/{CHANGE_MOD_AGAIN} is stale' in err
  # tree takes the edit into the commit that adds the file, and refresh
  # brings the later patches up to date.
  queue.update(project)
  assert mod_in(project.tree,
                'HEAD~3') == module_at(1).replace('module line 10\n', 'ten\n')
  queue.refresh(project)
  queue.check(project)


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
  with pytest.raises(Error, match=f'check found {len(problems)} problems'):
    queue.check(project)
  err = capsys.readouterr().err
  for problem in problems:
    assert f'check: patches/{problem}: a patch holds no diff' in err
  with pytest.raises(Error, match=f'patches/{problems[0]}'):
    queue.update(project, force=True)


def test_refresh_refuses_a_later_commit_that_deletes_a_new_file(follow_up):
  tree_git(follow_up, 'rm', '-q', MODULE_PATH)
  tree_git(follow_up, 'commit', '-qm', 'Drop mod')
  with pytest.raises(Error,
                     match=f'"Drop mod" deletes {MODULE_PATH}, which '
                     '"\\[Python\\] Add mod" adds'):
    queue.refresh(follow_up)


def test_refresh_keeps_a_commit_that_only_adds_files(project):
  commit_in_tree(project, 'Only new', {'sdks/python/apache_beam/x.py': 'X\n'})
  queue.refresh(project)
  patch = project.read_series().patches[-1]
  assert patch.new_files == ['sdks/python/apache_beam/x.py']
  assert 'diff --git' not in (project.patches / patch.name).read_text()
  edited = tree_id(project.tree)
  # Rebuilt from scratch, so that git am meets the patch without a diff.
  shutil.rmtree(project.tree)
  queue.update(project)
  assert tree_id(project.tree) == edited


def test_refresh_needs_a_tree(tmp_path, index):
  project = testing.make_project(tmp_path)
  with pytest.raises(Error, match='not a tree built by beampq'):
    queue.refresh(project)


# --------------------------------------------------------------------------
# Check.


def test_check_passes_on_a_consistent_queue_without_a_tree(project, capsys):
  shutil.rmtree(project.tree)
  queue.check(project)
  assert not project.tree.exists()
  assert '2 pull requests, 2 patches and 2 new files agree' in (
      capsys.readouterr().out)


def test_check_fails_on_a_hand_edited_patch(project, capsys):
  # The edited patch still applies, but its index line no longer matches
  # what the tree exports.
  patch = project.patches / FIRST
  patch.write_text(patch.read_text().replace('+five', '+FIVE'))
  with pytest.raises(Error, match='check found 2 problems'):
    queue.check(project)
  assert f'{FIRST} is stale' in capsys.readouterr().err


def test_check_fails_on_stray_and_missing_files(project, capsys):
  (project.root / 'sdks/python/apache_beam/stray.py').write_text('')
  (project.patches / '0009-stray.patch').write_text('')
  with pytest.raises(Error, match='check found 2 problems'):
    queue.check(project)
  err = capsys.readouterr().err
  assert 'stray.py is not listed in the series' in err
  assert '0009-stray.patch is not in the series' in err


def test_check_fails_on_local_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='check found 1 problems'):
    queue.check(project)


def test_check_fails_on_a_bad_changes_entry(project):
  project.changes.write_text(
      testing.CHANGES.replace('([#2](https', '(see [#2](https'))
  with pytest.raises(Error, match='check found 1 problems'):
    queue.check(project)


def add_empty_pull_request(project):
  project.description_file('fix-2').write_text('# Fix 2\n\nMore.\n')
  project.series_file.write_text(project.series_file.read_text() + '[fix-2]\n')


@pytest.mark.parametrize(
    'edit, problem',
    [
        (
            lambda p: p.description_file('feature').unlink(),
            "'feature' has no description"),
        (
            lambda p: p.description_file('fix').write_text('no title\n'),
            'fix.md: the first line is not'),
        (
            lambda p: p.description_file('old').write_text('# Old\n\nOld.\n'),
            'old.md describes a pull request that is not in the series'),
        (add_empty_pull_request, 'pull request [fix-2] has no patches'),
        (
            lambda p: p.changes.write_text(
                testing.CHANGES.replace('request: fix', 'request: fux')),
            "belongs to pull request 'fux', which is not in the series"),
    ])
def test_check_fails_on_pull_request_problems(project, capsys, edit, problem):
  edit(project)
  with pytest.raises(Error, match='check found 1 problems'):
    queue.check(project)
  assert problem in capsys.readouterr().err


# --------------------------------------------------------------------------
# The real queue of this repository against the real pinned base.


def test_real_queue_is_consistent():
  queue.check(Project())
