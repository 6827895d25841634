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

"""Tests of beampq.tree: importing the queue as commits (build/beam),
keeping it current, and never discarding local work."""

import json
import re
import shutil
from pathlib import Path

import pytest

from beampq import Error
from beampq import check
from beampq import git
from beampq import refresh
from beampq import state
from beampq import testing
from beampq import tree
from beampq import upstream
from beampq.testing import UTIL
from beampq.testing import commit_in_tree
from beampq.testing import tree_git
from beampq.testing import tree_id

FIRST = '0001-Python-Change-line-5.patch'
SECOND = '0002-Python-Add-a-module.patch'


def test_tree_has_the_base_then_one_commit_per_patch(project):
  subjects = tree_git(project, 'log', '--reverse', '--format=%s').splitlines()
  assert subjects == [
      'apache-beam 9.9.0 sdist (the base)',
      '[Python] Change line 5',
      '[Python] Add a module',
  ]
  assert tree_git(project, 'rev-parse',
                  'HEAD~2') == tree_git(project, 'rev-parse', tree.BASE_TAG)
  assert (project.tree / 'sdks/python/setup.cfg').read_text() == '[yapf]\n'
  added = tree_git(
      project, 'show', '--name-only', '--diff-filter=A', '--format=', 'HEAD')
  assert added.split() == [
      'sdks/python/apache_beam/new_mod.py',
      'sdks/python/apache_beam/new_mod_test.py',
  ]


def test_tree_commits_are_the_users_and_dated_as_what_they_hold(project):
  shutil.rmtree(project.tree)
  tree.update(project)
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
  # runs beampq from elsewhere: tree commits as them, keeping each patch's
  # author, and export makes them the author.
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
  refresh.refresh(project)
  tree.build(project, tmp_path / 'beam', quiet=True)
  assert git.output(
      'log', '--format=%an|%cn', f'{tree.BASE_TAG}..',
      cwd=tmp_path / 'beam').splitlines() == [
          'Someone Else|Ada', 'Test Author|Ada', 'Test Author|Ada'
      ]
  upstream.export(project, tmp_path / 'out')
  for patch in (tmp_path / 'out').rglob('*.patch'):
    assert 'From: Ada <ada@example.org>' in patch.read_text()


def test_a_tree_is_built_where_git_knows_nobody(project, tmp_path, monkeypatch):
  # A CI machine: no identity anywhere. The tree still builds, committed by
  # the tool, each commit keeping its patch's author.
  testing.forget_identity(monkeypatch, tmp_path)
  git.run('init', '-q', cwd=project.root)
  monkeypatch.chdir(tmp_path)
  tree.build(project, tmp_path / 'beam', quiet=True)
  log = git.output(
      'log',
      '--format=%an|%cn <%ce>',
      f'{tree.BASE_TAG}..',
      cwd=tmp_path / 'beam')
  tool = 'beampq <beampq@localhost.invalid>'
  assert log.splitlines() == [f'Test Author|{tool}'] * 2


def test_rebuilt_tree_equals_the_refreshed_one(project):
  edited = tree_id(project.tree)
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_id(project.tree) == edited
  check.check(project)


def test_tree_is_reproducible_and_a_no_op_when_current(project, capsys):
  # The fixture's tree holds commits made in it and refreshed: build twice.
  shutil.rmtree(project.tree)
  tree.update(project)
  built = tree_git(project, 'rev-parse', 'HEAD')
  shutil.rmtree(project.tree)
  tree.update(project)
  assert tree_git(project, 'rev-parse', 'HEAD') == built
  capsys.readouterr()
  tree.update(project)
  assert 'up to date' in capsys.readouterr().out
  tree.update(project, force=True)
  assert 'up to date' in capsys.readouterr().out
  assert tree_git(project, 'rev-parse', 'HEAD') == built


def test_tree_keeps_local_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='has work that is not in patches'):
    tree.update(project)
  assert tree_git(project, 'log', '-1', '--format=%s') == 'More'
  assert tree.update(project, local_work_ok=True) == project.tree
  assert tree_git(project, 'log', '-1', '--format=%s') == 'More'
  tree.update(project, force=True)
  assert tree_git(
      project, 'log', '-1', '--format=%s') == '[Python] Add a module'


def _pull(project, tag='pulled'):
  """Changes a patch's message, as a pull of the patch set would."""
  patch = project.patches / FIRST
  patch.write_text(
      patch.read_text().replace('line 5 was wrong', f'line 5 was wrong, {tag}'))


def _recipe(refused):
  """The commands of tree's carry-over recipe, as a user would run them."""
  return re.findall(r'`((?:git|python3 -m beampq) [^`]*)`',
                    str(refused.value))[:4]


def test_the_carry_over_recipe_keeps_work_over_a_pull(project):
  # Work committed in build/beam, then patches/ changed (a pull): tree
  # refuses with a recipe, and following it twice keeps every commit and
  # the pulled change.
  for name in ('mine', 'more'):
    commit_in_tree(
        project,
        f'[Python] {name}', {f'sdks/python/apache_beam/{name}.py': 'M\n'})
    _pull(project, name)
    with pytest.raises(Error, match='changed since it was built') as refused:
      tree.update(project)
    commands = _recipe(refused)
    assert [c.split()[0]
            for c in commands] == ['git', 'python3', 'git', 'python3']
    for command in commands:
      words = command.split()
      if words[0] == 'git':
        if words[-1].endswith('*.patch'):
          words[-1:] = sorted(
              str(p) for p in Path(words[-1]).parent.glob('*.patch'))
        git.run(*words[1:], cwd=project.root)
      elif words[3] == 'tree':
        tree.update(project, force=True)
      else:
        refresh.refresh(project)
    assert (project.root /
            f'sdks/python/apache_beam/{name}.py').read_text() == 'M\n'
    assert f', {name}' in (project.patches / FIRST).read_text()
    assert tree_git(project, 'log', '-1', '--format=%s') == f'[Python] {name}'
    check.check(project)


def test_the_recipe_asks_to_commit_uncommitted_work_first(project):
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('mine\n')
  _pull(project)
  with pytest.raises(Error, match='commit your changes in it first'):
    tree.update(project)
  assert (project.tree /
          'sdks/python/apache_beam/util.py').read_text() == 'mine\n'


def test_rewritten_commits_get_no_recipe_that_would_fail(project):
  # An amended patch commit cannot be replayed on the rebuilt queue.
  (project.tree / 'sdks/python/apache_beam/new_mod.py').write_text('A = 2\n')
  tree_git(project, 'commit', '-qa', '--amend', '--no-edit')
  _pull(project)
  with pytest.raises(Error, match='cannot be replayed: save them') as raised:
    tree.update(project)
  # The advice keeps the commits whole, messages included, and its
  # commands run.
  for command in re.findall(r'`(git -C [^`]*)`', str(raised.value)):
    assert git.attempt(*command.split()[1:], cwd=project.root).returncode == 0
  saved = list(project.build.glob('rewritten-*/*.patch'))
  assert len(saved) == 2 and 'Add a module' in saved[-1].read_text()


def test_tree_keeps_stashes_and_branches(project):
  # Neither moves HEAD nor dirties the tree, but a rebuild would lose them.
  (project.tree / 'sdks/python/apache_beam/new_mod.py').write_text('W = 1\n')
  tree_git(project, 'stash', '-q')
  tree_git(project, 'branch', 'wip')
  patch = project.patches / FIRST
  patch.write_text(patch.read_text() + '\n')
  with pytest.raises(Error, match='has 1 stash and branches wip'):
    tree.update(project)
  assert tree_git(project, 'stash', 'list')
  tree.update(project, force=True)
  assert not tree_git(project, 'stash', 'list')


def test_a_detached_head_is_no_work_unless_main_moved(project):
  tree_git(project, 'checkout', '-q', '--detach')
  patch = project.patches / FIRST
  patch.write_text(patch.read_text() + '\n')
  # main is what was built: a rebuild loses nothing.
  tree.update(project)
  tree_git(project, 'commit', '-q', '--allow-empty', '-m', 'Unrefreshed')
  tree_git(project, 'checkout', '-q', '--detach', 'HEAD~1')
  patch.write_text(patch.read_text() + '\n')
  with pytest.raises(Error, match='main moved to .*git checkout main'):
    tree.update(project)


def test_tree_carries_untracked_files_outside_sdks_over(project):
  # An editor's settings are no patch's: they neither count as local work
  # nor are lost when patches/ changes and the tree is rebuilt.
  # Names git quotes (spaces, non-ASCII) and a dangling link too.
  (project.tree / '.vscode').mkdir()
  (project.tree / '.vscode/settings.json').write_text('{}\n')
  (project.tree / 'my notes.txt').write_text('notes\n')
  (project.tree / 'caf\u00e9.md').write_text('menu\n')
  (project.tree / 'gone').symlink_to('nowhere')
  assert state.tree_state(project).current
  check.check(project)
  patch = project.patches / FIRST
  patch.write_text(patch.read_text() + '\n')
  tree.update(project)
  assert (project.tree / '.vscode/settings.json').read_text() == '{}\n'
  assert (project.tree / 'my notes.txt').read_text() == 'notes\n'
  assert (project.tree / 'caf\u00e9.md').read_text() == 'menu\n'
  assert (project.tree / 'gone').is_symlink()
  assert state.tree_state(project).current


def test_test_leftovers_in_sdks_are_no_local_work(project):
  # Running the tests or a virtualenv in the tree leaves these behind.
  python = project.tree / 'sdks/python'
  for leftover in ('.coverage', '.hypothesis/x', '.venv/bin/python'):
    (python / leftover).parent.mkdir(parents=True, exist_ok=True)
    (python / leftover).write_text('')
  assert state.tree_state(project).current
  refresh.refresh(project)


def test_a_new_file_that_tree_excludes_would_hide_is_rebuilt(project):
  # A package named build matches TREE_EXCLUDES' build/: added with -f in
  # build/beam, it must be added again when the tree is rebuilt.
  path = 'sdks/python/apache_beam/build/helper.py'
  (project.tree / path).parent.mkdir()
  (project.tree / path).write_text('HELPER = 1\n')
  tree_git(project, 'add', '-f', path)
  tree_git(project, 'commit', '-q', '-m', '[Python] Add a build helper')
  refresh.refresh(project)
  shutil.rmtree(project.tree)
  tree.update(project)
  assert (project.tree / path).read_text() == 'HELPER = 1\n'
  assert tree_git(project, 'ls-files', path) == path


def test_an_untracked_file_the_rebuilt_tree_has_is_not_overwritten(tmp_path):
  old, new = tmp_path / 'old', tmp_path / 'new'
  for folder, text in ((old, 'mine\n'), (new, 'tracked\n')):
    folder.mkdir()
    (folder / 'x.txt').write_text(text)
  with pytest.raises(Error, match=r'has files of its own .*\(x\.txt\)'):
    tree._carry_over(['x.txt'], old, new, force=False)
  tree._carry_over(['x.txt'], old, new, force=True)
  assert (new / 'x.txt').read_text() == 'tracked\n'


def test_tree_keeps_commits_only_a_tag_holds(project):
  commit_in_tree(project, 'Kept', {'sdks/python/apache_beam/util.py': 'x\n'})
  tree_git(project, 'tag', 'my-wip')
  tree_git(project, 'reset', '-q', '--hard', 'HEAD~1')
  state.write_stamp(
      project.tree,
      **dict(
          json.loads((project.tree / '.git' / state.STAMP).read_text()),
          head=tree_git(project, 'rev-parse', 'HEAD')))
  patch = project.patches / FIRST
  patch.write_text(patch.read_text() + '\n')
  with pytest.raises(Error, match='has tags my-wip'):
    tree.update(project)
  assert tree_git(project, 'log', '-1', '--format=%s', 'my-wip') == 'Kept'


def test_tree_refuses_a_tree_it_did_not_build(project):
  commit_in_tree(project, 'Mine', {'sdks/python/apache_beam/util.py': 'x\n'})
  (project.tree / '.git' / state.STAMP).unlink()
  with pytest.raises(Error, match='was not built by beampq'):
    tree.update(project)
  assert tree_git(project, 'log', '-1', '--format=%s') == 'Mine'
  tree.update(project, force=True)
  assert tree_git(
      project, 'log', '-1', '--format=%s') == '[Python] Add a module'


def test_a_patch_that_does_not_apply_fails_and_leaves_no_tree(project):
  patch = project.patches / SECOND
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  shutil.rmtree(project.tree)
  with pytest.raises(Error) as raised:
    tree.update(project)
  assert f'{SECOND} does not apply' in str(raised.value)
  assert 'sdks/python/apache_beam/util.py' in str(raised.value)
  assert not project.tree.exists()
  assert [p.name for p in project.build.iterdir()] == ['cache']


def test_a_patch_git_am_refuses_is_named_with_gits_reason(project):
  # The diff applies, but git am needs the author the header names.
  patch = project.patches / SECOND
  patch.write_text(re.sub(r'(?m)^From: .*\n', '', patch.read_text(), count=1))
  shutil.rmtree(project.tree)
  with pytest.raises(
      Error, match=f'^patches/{SECOND}: git am failed: (fatal|error): [^[]*$'):
    tree.update(project)
  assert not project.tree.exists()


def test_a_failed_rebuild_keeps_the_previous_tree(project):
  head = tree_git(project, 'rev-parse', 'HEAD')
  patch = project.patches / SECOND
  patch.write_text(patch.read_text().replace(' line 29\n', ' line 29 !\n'))
  with pytest.raises(Error, match='does not apply'):
    tree.update(project)
  assert tree_git(project, 'rev-parse', 'HEAD') == head
  with pytest.raises(Error, match='does not apply'):
    tree.update(project)


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
    tree.update(other)


def test_a_missing_patch_or_new_file_is_named(project):
  shutil.rmtree(project.tree)
  (project.root / 'sdks/python/apache_beam/new_mod.py').unlink()
  with pytest.raises(Error,
                     match='lists sdks/python/apache_beam/new_mod'
                     f'.py under {SECOND}, but'):
    tree.update(project)
  (project.patches / FIRST).unlink()
  with pytest.raises(Error,
                     match=f'names patches/{FIRST}, which does not exist'):
    tree.update(project)
  assert not project.tree.exists()
