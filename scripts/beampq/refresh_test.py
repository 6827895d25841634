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

"""Tests of beampq.refresh: patches/, sdks/ and the series from
build/beam's commits."""

import re
import shutil

import pytest

from beampq import Error
from beampq import check
from beampq import git
from beampq import refresh
from beampq import testing
from beampq import tree
from beampq.testing import MODULE_PATH
from beampq.testing import UTIL
from beampq.testing import commit_in_tree
from beampq.testing import tree_git
from beampq.testing import tree_id

FIRST = '0001-Python-Change-line-5.patch'
SECOND = '0002-Python-Add-a-module.patch'


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


def test_refresh_keeps_each_commits_author(project, monkeypatch):
  # As `git commit --amend` does: a new commit's patch is its author's, and
  # a refresh by someone else leaves the other patches as they were.
  before = {p.name: p.read_text() for p in project.patches.glob('*.patch')}
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
  monkeypatch.setenv('GIT_AUTHOR_NAME', 'Ada Contributor')
  monkeypatch.setenv('GIT_AUTHOR_EMAIL', 'ada@example.org')
  refresh.refresh(project)
  third = (project.patches / '0003-Python-Change-line-9.patch').read_text()
  assert 'From: Someone Else <else@example.com>' in third
  assert 'Date: Tue, 4 Mar 2025 05:06:07 +0000' in third
  for name, text in before.items():
    assert (project.patches / name).read_text() == text, name
  check.check(project)


def test_refresh_after_a_pull_says_how_to_keep_both(project):
  # A commit in build/beam, then patches/ changed under it (a pull): a
  # refresh would undo the pull, and the message says how to keep both.
  commit_in_tree(project, 'Mine', {'sdks/python/apache_beam/util.py': 'x\n'})
  patch = project.patches / '0001-Python-Change-line-5.patch'
  patch.write_text(patch.read_text() + '\n')
  with pytest.raises(Error,
                     match=r'undo those changes: to carry its '
                     r'commits over a rebuild, run `git -C .* format-patch '
                     r'-k'):
    refresh.refresh(project)


def test_refresh_keeps_each_patch_in_its_pull_request(project):
  # Reword the first patch of `feature` and add a commit after it: the
  # reworded patch stays in `feature` (same diff) and the new one joins it.
  tree_git(project, 'commit', '-q', '--amend', '-m', '[Python] Add new_mod')
  commit_in_tree(
      project, '[Python] Add x', {'sdks/python/apache_beam/x.py': 'X\n'})
  refresh.refresh(project)
  assert [
      (pr.name, [p.name for p in pr.patches])
      for pr in project.read_series().pull_requests
  ] == [
      ('fix', [FIRST]),
      ('feature', ['0002-Python-Add-new_mod.patch', '0003-Python-Add-x.patch']),
  ]
  check.check(project)


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
    refresh.refresh(project)
  tree.update(project, force=True)
  check.check(project)


def test_refresh_refuses_to_empty_a_pull_request(project):
  # build/beam reset to its queue's first commit: [feature] would lose its
  # only patch, and its new file.
  tree_git(project, 'reset', '-q', '--hard', 'HEAD~1')
  with pytest.raises(
      Error,
      match=(re.escape(f'[feature] would lose every patch ({SECOND})') +
             ': build/beam has 1 commit on the base where the '
             'series has 2')):
    refresh.refresh(project)
  assert (project.patches / SECOND).is_file()
  assert _pull_requests(project) == [('fix', [FIRST]), ('feature', [SECOND])]
  # Dropped on purpose: its lines out of the series first.
  series = project.patches / 'series'
  series.write_text(series.read_text().split('[feature]\n')[0])
  refresh.refresh(project, force=True)
  assert _pull_requests(project) == [('fix', [FIRST])]
  assert not (project.patches / SECOND).exists()


def test_refresh_needs_a_pull_request(tmp_path, index):
  index.publish('apache_beam-9.9.0.tar.gz', testing.SDIST)
  project = testing.make_project(tmp_path)
  project.series_file.write_text('')
  tree.update(project)
  commit_in_tree(project, 'Change', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='the series names no pull request'):
    refresh.refresh(project)


def test_amended_commit_round_trips(project):
  tree_git(project, 'rebase', '-q', '--exec', 'true', tree.BASE_TAG)
  (project.tree / 'sdks/python/apache_beam/new_mod.py').write_text('NEW = 2\n')
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  refresh.refresh(project)
  assert (project.root /
          'sdks/python/apache_beam/new_mod.py').read_text() == 'NEW = 2\n'
  check.check(project)


def test_refresh_refuses_a_dirty_tree(project):
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  with pytest.raises(Error, match='uncommitted changes'):
    refresh.refresh(project)


def test_refresh_refuses_an_untracked_file_a_patch_could_add(project):
  (project.tree / 'sdks/python/apache_beam/forgotten.py').write_text('X = 1\n')
  with pytest.raises(Error, match='uncommitted changes .*forgotten.py'):
    refresh.refresh(project)


def test_refresh_ignores_untracked_files_outside_sdks(project):
  # An editor's settings in the checkout are no patch's, and must not stop
  # a refresh.
  (project.tree / '.vscode').mkdir()
  (project.tree / '.vscode/settings.json').write_text('{}\n')
  refresh.refresh(project)
  check.check(project)


def test_refresh_refuses_an_operation_in_progress(project):
  tree_git(project, 'checkout', '-q', '-b', 'other', 'HEAD~1')
  commit_in_tree(
      project,
      'Conflicting',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 30\n', 'x\n')})
  assert git.attempt('cherry-pick', 'main', cwd=project.tree).returncode != 0
  with pytest.raises(Error, match='a cherry-pick is in progress'):
    refresh.refresh(project)


def test_refresh_refuses_a_bisect_in_progress(project):
  tree_git(project, 'bisect', 'start')
  with pytest.raises(Error, match='a bisect is in progress'):
    refresh.refresh(project)


@pytest.mark.parametrize(
    'checkout, commit, shown',
    [
        (('HEAD~1', ),
         False,
         'a detached HEAD checked out, which main '
         'already holds: run `git checkout main`'),
        (('-b', 'other'),
         True,
         'other checked out, with commits main lacks: '
         'move them onto main .*git merge --ff-only other'),
        (('-b', 'other', 'HEAD~1'),
         True,
         'other checked out, which has left '
         'main: move its commits onto main .*git rebase main'),
        (('HEAD~1', ),
         True,
         'a detached HEAD checked out, which has left main: move its '
         'commits onto main .*git rebase main`, then `git checkout -B main`'),
    ])
def test_refresh_refuses_a_head_other_than_the_queue(
    project, capsys, checkout, commit, shown):
  # From an earlier commit, the patches after it would be dropped; from
  # another branch, that branch's commits would stay off the queue.
  before = {p.name: p.read_text() for p in project.patches.glob('*.patch')}
  tree_git(project, 'checkout', '-q', *checkout)
  if commit:
    commit_in_tree(project, 'Mine', {'sdks/python/apache_beam/x.py': 'X = 1\n'})
  with pytest.raises(Error, match=f'has {shown}'):
    refresh.refresh(project)
  assert {
      p.name: p.read_text()
      for p in project.patches.glob('*.patch')
  } == before
  # check and tree give the same advice, not a refresh that refuses.
  with pytest.raises(Error, match='check found 1 problem'):
    check.check(project)
  assert re.search(
      f'has {shown}.*, then run `python3 -m beampq refresh`',
      capsys.readouterr().err)
  with pytest.raises(
      Error,
      match=f'has {shown}.*, then run `python3 -m beampq refresh` to keep'):
    tree.update(project)


@pytest.mark.parametrize('branch', [('-b', 'other'), ()])
def test_the_advice_for_a_head_that_left_the_queue_works(project, branch):
  tree_git(project, 'checkout', '-q', *branch, 'HEAD~1')
  commit_in_tree(project, 'Mine', {'sdks/python/apache_beam/x.py': 'X = 1\n'})
  with pytest.raises(Error) as raised:
    refresh.refresh(project)
  for command in re.findall(r'`(git [^`]*)`', str(raised.value)):
    for step in command.split(' && '):
      tree_git(project, *step.split()[1:])
  refresh.refresh(project)
  assert project.read_series().patches[-1].new_files == [
      'sdks/python/apache_beam/x.py'
  ]


@pytest.mark.parametrize(
    'names, shown',
    [
        ('subject', 'is not squashed .*--autosquash base'),
        ('hash', 'is not squashed .*--autosquash base'),
        # Autosquash would leave it where it is: running it cannot help.
        ('nothing', 'names no commit before it.*reword it'),
    ])
def test_refresh_refuses_an_unsquashed_fixup(project, names, shown):
  first = tree_git(project, 'rev-list', '--reverse', 'base..HEAD').split()[0]
  target = {
      'subject': tree_git(project, 'log', '-1', '--format=%s', first)[:12],
      'hash': first[:10],
      'nothing': '[Python] No such change',
  }[names]
  commit_in_tree(
      project,
      f'fixup! fixup! {target}',
      {'sdks/python/apache_beam/util.py': UTIL.replace('line 30\n', 'x\n')})
  with pytest.raises(Error, match=shown):
    refresh.refresh(project)


def test_refresh_refuses_a_later_commit_that_deletes_a_new_file(follow_up):
  tree_git(follow_up, 'rm', '-q', MODULE_PATH)
  tree_git(follow_up, 'commit', '-qm', 'Drop mod')
  with pytest.raises(Error,
                     match=f'"Drop mod" deletes {MODULE_PATH}, which '
                     '"\\[Python\\] Add mod" adds'):
    refresh.refresh(follow_up)


def test_refresh_keeps_a_commit_that_only_adds_files(project):
  commit_in_tree(project, 'Only new', {'sdks/python/apache_beam/x.py': 'X\n'})
  refresh.refresh(project)
  patch = project.read_series().patches[-1]
  assert patch.new_files == ['sdks/python/apache_beam/x.py']
  assert 'diff --git' not in (project.patches / patch.name).read_text()
  edited = tree_id(project.tree)
  # Rebuilt from scratch, so that git am meets the patch without a diff.
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_id(project.tree) == edited


@pytest.mark.parametrize('line', ['---', '--- a/x.py', 'diff --git a/x b/x'])
def test_refresh_refuses_a_message_git_am_would_cut(project, line):
  message = tree_git(project, 'log', '-1', '--format=%B').strip()

  def end_message_with(text):
    tree_git(
        project,
        'commit',
        '-q',
        '--amend',
        '-m',
        f'{message}\n\n{text}\nA line after it.')

  end_message_with(line)
  with pytest.raises(Error,
                     match='reads as the start of the diff.*' +
                     re.escape(repr(line))):
    refresh.refresh(project)
  # Indented, the line is only text, and the message survives a rebuild.
  end_message_with(f'  {line}')
  refresh.refresh(project)
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_git(project, 'log', '-1',
                  '--format=%B').strip().endswith('A line after it.')


def test_refresh_needs_a_tree(tmp_path, index):
  project = testing.make_project(tmp_path)
  with pytest.raises(Error, match='not a tree built by beampq.*tree` first'):
    refresh.refresh(project)


def test_refresh_of_a_tree_without_its_stamp_says_to_force(project):
  # A tree whose stamp is gone is one that tree refuses without --force.
  (project.tree / '.git' / 'beampq.json').unlink()
  with pytest.raises(Error, match='not a tree built by beampq.*tree --force'):
    refresh.refresh(project)
  with pytest.raises(Error, match='was not built by beampq'):
    tree.update(project)


def _edit_util(project, old, new):
  util = project.tree / 'sdks/python/apache_beam/util.py'
  util.write_text(util.read_text().replace(old, new))


def _pull_requests(project):
  return [(pr.name, [p.name for p in pr.patches])
          for pr in project.read_series().pull_requests]


def test_a_reworded_and_amended_commit_keeps_its_pull_request(project):
  # The first (and only) patch of `feature`, reworded and amended at once,
  # matches no patch by subject or diff: it takes its position's pull
  # request, not that of the commit before it.
  _edit_util(project, 'thirty\n', 'THIRTY\n')
  tree_git(project, 'commit', '-qa', '--amend', '-m', '[Python] Add new_mod')
  refresh.refresh(project)
  assert _pull_requests(project) == [
      ('fix', [FIRST]), ('feature', ['0002-Python-Add-new_mod.patch'])
  ]
  check.check(project)


def test_refresh_refuses_a_commit_that_may_be_either_pull_requests(project):
  # As above, and a new commit at the end: the queue grew, so positions say
  # nothing, and the edited commit may end `fix` or start `feature`.
  _edit_util(project, 'thirty\n', 'THIRTY\n')
  tree_git(project, 'commit', '-qa', '--amend', '-m', '[Python] Add new_mod')
  commit_in_tree(
      project, '[Python] Add x', {'sdks/python/apache_beam/x.py': 'X\n'})
  with pytest.raises(Error,
                     match='"\\[Python\\] Add new_mod" matches no patch'):
    refresh.refresh(project)


def test_a_new_commit_joins_the_pull_request_it_follows(project):
  # A new commit at the end of `fix` (before `feature`'s, which keeps its
  # patch) joins `fix`.
  tree_git(project, 'rebase', '-q', '--exec', 'true', tree.BASE_TAG)
  first = tree_git(project, 'rev-list', '--reverse', f'{tree.BASE_TAG}..HEAD')
  first = first.split()[0]
  second = tree_git(project, 'rev-parse', 'HEAD')
  tree_git(project, 'reset', '-q', '--hard', first)
  commit_in_tree(
      project, '[Python] Add y', {'sdks/python/apache_beam/y.py': 'Y\n'})
  tree_git(project, 'cherry-pick', second)
  refresh.refresh(project)
  assert _pull_requests(project) == [
      ('fix', [FIRST, '0002-Python-Add-y.patch']),
      ('feature', ['0003-Python-Add-a-module.patch']),
  ]


def test_a_new_commit_where_a_dropped_one_was_is_not_taken_for_it(project):
  # `feature` has two patches; one rebase drops its last and adds a commit
  # after `fix`'s. The queue keeps its length, but the patch at the new
  # commit's position is the next commit's: the new one may end `fix` or be
  # the dropped patch edited, and is refused, not given to `feature`.
  commit_in_tree(
      project, '[Python] Add x', {'sdks/python/apache_beam/x.py': 'X\n'})
  refresh.refresh(project)
  tree_git(project, 'rebase', '-q', '--exec', 'true', tree.BASE_TAG)
  first, second, _ = tree_git(
      project, 'rev-list', '--reverse', f'{tree.BASE_TAG}..HEAD').split()
  tree_git(project, 'reset', '-q', '--hard', first)
  commit_in_tree(
      project, '[Python] Add y', {'sdks/python/apache_beam/y.py': 'Y\n'})
  tree_git(project, 'cherry-pick', second)
  with pytest.raises(Error, match='"\\[Python\\] Add y" matches no patch'):
    refresh.refresh(project)


def test_refresh_refuses_to_delete_files_the_series_does_not_name(project):
  draft = project.patches / '0099-Draft.patch'
  draft.write_text('a draft\n')
  notes = project.root / 'sdks/python/apache_beam/notes/draft.py'
  notes.parent.mkdir()
  notes.write_text('NOTES = 1\n')
  cache = project.root / 'sdks/python/apache_beam/__pycache__/new_mod.pyc'
  cache.parent.mkdir()
  cache.write_bytes(b'')
  with pytest.raises(
      Error,
      match=re.escape(
          'patches/series does not name patches/0099-Draft.patch, '
          'sdks/python/apache_beam/notes/draft.py, which refreshing would '
          'delete')):
    refresh.refresh(project)
  assert draft.is_file() and notes.is_file()
  refresh.refresh(project, force=True)
  assert not draft.exists() and not notes.exists()
  check.check(project)


@pytest.mark.parametrize('mode', ['100755', '120000'])
def test_refresh_refuses_a_new_file_it_cannot_keep_as_it_is(project, mode):
  # sdks/ keeps contents, and tree adds regular files: an executable or a
  # link would come back as a plain file, with check none the wiser.
  path = 'sdks/python/apache_beam/tool.sh'
  target = project.tree / path
  if mode == '120000':
    target.symlink_to('new_mod.py')
  else:
    target.write_text('echo hi\n')
    target.chmod(0o755)
  tree_git(project, 'add', path)
  tree_git(project, 'commit', '-q', '-m', '[Python] Add a tool')
  with pytest.raises(Error, match=f'adds {path} with mode {mode}'):
    refresh.refresh(project)
  assert not (project.root / path).exists()


def test_refresh_refuses_to_overwrite_edited_patches(project):
  patch = project.patches / FIRST
  edited = patch.read_text().replace('+five', '+FIVE')
  patch.write_text(edited)
  with pytest.raises(Error, match='patches/ or sdks/ changed since'):
    refresh.refresh(project)
  assert patch.read_text() == edited
  refresh.refresh(project, force=True)
  assert '+five' in patch.read_text()
