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

"""Tests of beampq.git, on real repositories."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from beampq import Error
from beampq import git
from beampq import testing
from beampq.git import Identity

PACKAGE = Path(__file__).resolve().parent


def make_repo(path: Path) -> Path:
  path.mkdir()
  git.run('init', '-q', '-b', 'main', cwd=path)
  return path


def commit(repo: Path, name: str, text: str, message: str, **env: str):
  (repo / name).write_text(text)
  git.run('add', name, cwd=repo)
  git.run('commit', '-q', '-m', message, cwd=repo, env=env)
  return git.output('rev-parse', 'HEAD', cwd=repo)


def test_identity_is_gits():
  assert git.identity() == Identity('Test Author', 'author@example.com')
  assert git.identity('COMMITTER') == Identity(
      'Test Committer', 'committer@example.com')


def forget_identity(tmp_path: Path, monkeypatch) -> Path:
  """Takes every identity away from git; returns a new repository with no
  config of its own to ask git in."""
  testing.forget_identity(monkeypatch, tmp_path)
  return make_repo(tmp_path / 'repo')


def set_identity(tmp_path: Path, monkeypatch, repo: Path, where: str):
  """Makes Ada the user, in one of the places git reads an identity from."""
  if where == 'environment':
    for role in ('AUTHOR', 'COMMITTER'):
      monkeypatch.setenv(f'GIT_{role}_NAME', 'Ada')
      monkeypatch.setenv(f'GIT_{role}_EMAIL', 'ada@example.org')
    return
  config = {
      'local': repo / '.git' / 'config',
      'global': tmp_path / 'global-gitconfig',
      'system': tmp_path / 'system-gitconfig',
  }[where]
  git.run('config', '--file', str(config), 'user.name', 'Ada', cwd=repo)
  git.run(
      'config',
      '--file',
      str(config),
      'user.email',
      'ada@example.org',
      cwd=repo)


@pytest.mark.parametrize('where', ['local', 'global', 'system', 'environment'])
def test_identity_reads_the_users_config(tmp_path, monkeypatch, where):
  repo = forget_identity(tmp_path, monkeypatch)
  set_identity(tmp_path, monkeypatch, repo, where)
  ada = Identity('Ada', 'ada@example.org')
  assert git.identity(cwd=repo) == ada
  assert git.identity('COMMITTER', cwd=repo) == ada


def test_a_clones_own_identity_is_asked_where_it_is(tmp_path, monkeypatch):
  repo = forget_identity(tmp_path, monkeypatch)
  set_identity(tmp_path, monkeypatch, repo, 'local')
  (tmp_path / 'global-gitconfig'
   ).write_text('[user]\n\tname = Bob\n\temail = bob@example.org\n')
  assert git.identity(cwd=repo) == Identity('Ada', 'ada@example.org')
  assert git.identity(cwd=tmp_path) == Identity('Bob', 'bob@example.org')


def test_an_unknown_identity_is_a_clear_error(tmp_path, monkeypatch):
  repo = forget_identity(tmp_path, monkeypatch)
  with pytest.raises(Error,
                     match=f'git does not know who you are in {repo}: set'):
    git.identity(cwd=repo)


def test_an_unknown_identity_gives_the_fallback(tmp_path, monkeypatch):
  repo = forget_identity(tmp_path, monkeypatch)
  tool = Identity('tool', 'tool@example.invalid')
  assert git.identity('COMMITTER', cwd=repo, fallback=tool) == tool
  set_identity(tmp_path, monkeypatch, repo, 'local')
  ada = Identity('Ada', 'ada@example.org')
  assert git.identity('COMMITTER', cwd=repo, fallback=tool) == ada


def test_the_git_tests_pass_in_a_clone_with_its_own_identity(tmp_path):
  # As a user who set user.name and user.email in their clone only
  # (`git config` without --global): the tests above must not read it.
  clone = make_repo(tmp_path / 'clone')
  shutil.copytree(
      PACKAGE,
      clone / 'scripts' / 'beampq',
      ignore=shutil.ignore_patterns('__pycache__'))
  git.run('config', 'user.name', 'Clone User', cwd=clone)
  git.run('config', 'user.email', 'clone@example.org', cwd=clone)
  env = {
      name: value
      for name, value in os.environ.items()
      if not name.startswith(('GIT_', 'PYTEST_'))
  }
  result = subprocess.run(
      [
          sys.executable,
          '-m',
          'pytest',
          '-q',
          '-p',
          'no:cacheprovider',
          # A folder of its own: in the shared one, pytest would delete the
          # outer run's older folders when it ends, tens of seconds of work.
          f'--basetemp={tmp_path / "inner"}',
          '-k',
          'not in_a_clone_with_its_own_identity',
          'scripts/beampq/git_test.py',
          'scripts/beampq/tree_test.py::test_the_projects_identity_commits',
      ],
      cwd=clone,
      env=dict(
          env, PYTHONPATH=str(clone / 'scripts'), PYTHONDONTWRITEBYTECODE='1'),
      capture_output=True,
      text=True,
      check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert ' passed' in result.stdout and 'skipped' not in result.stdout


def test_set_author_keeps_dates_messages_and_files(tmp_path):
  repo = make_repo(tmp_path / 'repo')
  base = commit(repo, 'a', '1\n', 'base')
  dated = '2024-05-06T07:08:09+02:00'
  commit(
      repo,
      'a',
      '2\n',
      'one\n\nbody\n',
      GIT_AUTHOR_NAME='Other',
      GIT_AUTHOR_DATE=dated,
      GIT_COMMITTER_DATE=dated)
  commit(repo, 'b', '3\n', 'two', GIT_AUTHOR_DATE=dated)
  files = git.output('rev-parse', 'HEAD^{tree}', cwd=repo)
  me = Identity('Me', 'me@example.org')
  committer = git.identity('COMMITTER', repo)
  assert git.set_author(repo, base, me, committer) == 2
  log = git.output(
      'log', '--format=%an <%ae>|%aI|%cI|%B', f'{base}..HEAD',
      cwd=repo).split('\n')
  assert [line for line in log if line] == [
      f'Me <me@example.org>|{dated}|' +
      git.output('log', '-1', '--format=%cI', 'HEAD', cwd=repo) + '|two',
      f'Me <me@example.org>|{dated}|{dated}|one',
      'body',
  ]
  assert git.output('rev-parse', 'HEAD^{tree}', cwd=repo) == files
  assert git.dirty_paths(repo) == []
  head = git.output('rev-parse', 'HEAD', cwd=repo)
  assert git.set_author(repo, base, me, committer) == 0
  assert git.output('rev-parse', 'HEAD', cwd=repo) == head


def test_patch_subject_and_id(tmp_path):
  repo = make_repo(tmp_path / 'repo')
  commit(repo, 'a', '1\n', 'base')
  commit(
      repo,
      'a',
      '2\n',
      '[Python] A long subject that git format-patch '
      'folds over two lines of the header')
  first = git.output('format-patch', '-1', '--stdout', cwd=repo)
  git.run('commit', '-q', '--amend', '-m', '[Python] Reworded', cwd=repo)
  reworded = git.output('format-patch', '-1', '--stdout', cwd=repo)
  assert git.patch_subject(first) == (
      '[Python] A long subject that git format-patch folds over two lines '
      'of the header')
  assert git.patch_subject(reworded) == '[Python] Reworded'
  assert git.patch_id(first) == git.patch_id(reworded) is not None
  assert git.patch_id(reworded.split('\ndiff --git')[0]) is None


def test_changed_paths_include_uncommitted_work(tmp_path):
  repo = make_repo(tmp_path / 'repo')
  base = commit(repo, 'a', '1\n', 'base')
  (repo / 'b').write_text('')
  commit(repo, 'b', 'b\n', 'add b')
  (repo / 'a').write_text('edited\n')
  (repo / 'c').write_text('untracked\n')
  assert git.changed_paths(repo, base) == (['a'], ['b', 'c'])


def test_operation_in_progress(tmp_path):
  repo = make_repo(tmp_path / 'repo')
  commit(repo, 'a', '1\n', 'base')
  git.run('checkout', '-q', '-b', 'other', cwd=repo)
  commit(repo, 'a', 'other\n', 'other')
  git.run('checkout', '-q', 'main', cwd=repo)
  commit(repo, 'a', 'main\n', 'main')
  assert git.operation_in_progress(repo) is None
  assert git.attempt('cherry-pick', 'other', cwd=repo).returncode != 0
  assert git.operation_in_progress(repo) == 'cherry-pick'


def test_failures_raise_with_gits_message(tmp_path):
  with pytest.raises(Error, match='git rev-parse HEAD failed in .*: fatal'):
    git.run('rev-parse', 'HEAD', cwd=make_repo(tmp_path / 'repo'))


def test_error_line_skips_hints():
  failed = subprocess.CompletedProcess(
      ['git', 'add'],
      1,
      '',
      'The following paths are ignored by one of your .gitignore files:\n'
      'sdks/build\n'
      'hint: Use -f if you really want to add them.\n'
      'hint: Turn this message off by running\n')
  assert git.error_line(failed) == 'sdks/build'


def test_commits_touching_names_each_commit_of_a_path(tmp_path):
  repo = make_repo(tmp_path / 'repo')
  base = commit(repo, 'a', '1\n', 'base')
  first = commit(repo, 'a', '2\n', 'one')
  commit(repo, 'b', '1\n', 'two')
  last = commit(repo, 'a', '3\n', 'three: a again')
  found = git.commits_touching(repo, base, 'a')
  assert [subject for _, subject in found] == ['one', 'three: a again']
  assert first.startswith(found[0][0]) and last.startswith(found[1][0])
  assert git.commits_touching(repo, base, 'c') == []
