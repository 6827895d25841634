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

"""Tests of beampq.upstream: applying the queue to a Beam checkout and
exporting it as one folder per pull request."""

import re
import subprocess

import pytest

from beampq import Error
from beampq import check
from beampq import git
from beampq import testing
from beampq import tree
from beampq import upstream
from beampq.project import Project
from beampq.testing import MODULE_PATH
from beampq.testing import UTIL
from beampq.testing import make_checkout
from beampq.testing import module_at
from beampq.testing import tree_git
from beampq.testing import tree_id

SECOND = '0002-Python-Add-a-module.patch'


def test_apply_reproduces_the_tree_and_keeps_subject_tags(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam')
  upstream.apply(project, checkout)
  assert tree_id(checkout) == tree_id(project.tree)
  assert git.output(
      'log', '--format=%s', f'{tree.BASE_TAG}..HEAD',
      cwd=checkout).splitlines() == [
          '[Python] Add a module', '[Python] Change line 5'
      ]


def test_apply_inserts_changes_entries(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam', testing.UPSTREAM_CHANGES)
  upstream.apply(project, checkout)
  text = (checkout / 'CHANGES.md').read_text()
  unreleased = text.split('# [9.8.0]')[0]
  assert '* (Python) Added a thing' in unreleased
  assert '* (Python) Fixed a bug' in unreleased
  assert 'pull request:' not in unreleased
  assert git.output('status', '--porcelain', cwd=checkout) == ''
  assert git.output(
      'log', '-1', '--format=%s',
      cwd=checkout).startswith('Add CHANGES.md entries')


@pytest.mark.parametrize(
    'setup, message',
    [
        ('dirty', 'has uncommitted changes'),
        ('merging', 'a merge is in progress'),
        ('not_git', 'is not the top of a git checkout'),
        ('not_beam', 'is not a Beam checkout'),
        ('missing', 'is not a directory'),
    ])
def test_apply_refuses_bad_checkouts(project, tmp_path, setup, message):
  checkout = tmp_path / 'beam'
  if setup == 'dirty':
    make_checkout(project, checkout)
    (checkout / 'sdks/python/apache_beam/util.py').write_text('mine\n')
  elif setup == 'merging':
    # A merge stopped at a conflict: `git am` would refuse or mix its
    # commits into it.
    make_checkout(project, checkout)
    util = checkout / 'sdks/python/apache_beam/util.py'
    start = git.output('rev-parse', 'HEAD', cwd=checkout)
    for branch, text in (('theirs', 'theirs\n'), ('ours', 'ours\n')):
      git.run('checkout', '-q', '-b', branch, start, cwd=checkout)
      util.write_text(text)
      git.run('commit', '-qam', branch, cwd=checkout)
    assert git.attempt('merge', 'theirs', cwd=checkout).returncode != 0
  elif setup == 'not_git':
    checkout.mkdir()
  elif setup == 'not_beam':
    checkout.mkdir()
    git.run('init', '-q', cwd=checkout)
  with pytest.raises(Error, match=message):
    upstream.apply(project, checkout)
  if setup == 'dirty':
    assert (checkout /
            'sdks/python/apache_beam/util.py').read_text() == 'mine\n'


def test_apply_leaves_the_checkout_as_it_was_on_failure(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam')
  conflicting = UTIL.replace('line 30\n', 'mine\n')
  (checkout / 'sdks/python/apache_beam/util.py').write_text(conflicting)
  git.run('commit', '-qam', 'mine', cwd=checkout, isolated=False)
  head = git.output('rev-parse', 'HEAD', cwd=checkout)
  with pytest.raises(Error) as raised:
    upstream.apply(project, checkout)
  assert f'{SECOND} does not apply' in str(raised.value)
  # git am's quiet output names no file; the error does.
  assert 'sdks/python/apache_beam/util.py' in str(raised.value)
  assert git.output('rev-parse', 'HEAD', cwd=checkout) == head
  assert git.output('status', '--porcelain', cwd=checkout) == ''
  assert git.operation_in_progress(checkout) is None


def test_applying_twice_says_the_checkout_has_the_patches(project, tmp_path):
  checkout = make_checkout(project, tmp_path / 'beam')
  upstream.apply(project, checkout)
  head = git.output('rev-parse', 'HEAD', cwd=checkout)
  with pytest.raises(
      Error,
      match='already has a commit "\\[Python\\] Change line 5" '
      '\\(0001-Python-Change-line-5.patch\\): the series was applied'):
    upstream.apply(project, checkout)
  assert git.output('rev-parse', 'HEAD', cwd=checkout) == head


def test_apply_names_the_checkouts_changes_file_it_cannot_use(
    project, tmp_path):
  checkout = make_checkout(
      project, tmp_path / 'beam', changes='# Apache Beam\n\nNo releases.\n')
  head = git.output('rev-parse', 'HEAD', cwd=checkout)
  with pytest.raises(
      Error,
      match=re.escape(f'{checkout / "CHANGES.md"}: CHANGES.md has no') +
      '.*; the checkout is left as it was'):
    upstream.apply(project, checkout)
  assert git.output('rev-parse', 'HEAD', cwd=checkout) == head


def test_apply_commits_as_the_clone_where_the_checkout_knows_nobody(
    project, tmp_path, monkeypatch):
  checkout = make_checkout(project, tmp_path / 'beam', testing.UPSTREAM_CHANGES)
  # git knows nobody but in the patch set's clone, and guesses no one.
  for name in testing.IDENTITY:
    monkeypatch.delenv(name)
  config = tmp_path / 'gitconfig'
  config.write_text('[user]\n\tuseConfigOnly = true\n')
  monkeypatch.setenv('GIT_CONFIG_GLOBAL', str(config))
  monkeypatch.setenv('GIT_CONFIG_NOSYSTEM', '1')
  git.run('init', '-q', cwd=project.root)
  head = git.output('rev-parse', 'HEAD', cwd=checkout)
  with pytest.raises(Error, match='git does not know who you are'):
    upstream.apply(project, checkout)
  assert git.output('rev-parse', 'HEAD', cwd=checkout) == head
  git.run('config', 'user.name', 'Clone User', cwd=project.root)
  git.run('config', 'user.email', 'clone@example.com', cwd=project.root)
  upstream.apply(project, checkout)
  assert git.output(
      'log', '--format=%cn <%ce>', f'{head}..HEAD',
      cwd=checkout).splitlines() == ['Clone User <clone@example.com>'] * 3
  assert git.output('log', '-1', '--format=%an', cwd=checkout) == 'Clone User'


def test_export_says_it_leaves_out_work_not_refreshed(
    project, tmp_path, capsys):
  testing.commit_in_tree(
      project, 'Not refreshed', {'sdks/python/apache_beam/x.py': 'X = 1\n'})
  capsys.readouterr()
  upstream.export(project, tmp_path / 'out')
  assert 'has work not in patches/ (HEAD moved to' in capsys.readouterr().out
  squashed = (tmp_path / 'out' / 'feature' / 'squashed.patch').read_text()
  assert 'apache_beam/x.py' not in squashed


def test_export_sees_main_behind_a_detached_head_and_a_moved_base(
    project, tmp_path, capsys):
  testing.commit_in_tree(
      project, 'Not refreshed', {'sdks/python/apache_beam/x.py': 'X = 1\n'})
  tree_git(project, 'checkout', '-q', '--detach', 'HEAD~1')
  tree_git(project, 'tag', '-f', 'base', 'HEAD~1')
  capsys.readouterr()
  upstream.export(project, tmp_path / 'out')
  said = capsys.readouterr().out
  assert 'has work not in patches/ (main moved to' in said
  # Built afresh from patches/: every pull request, each patch once.
  assert sorted(p.name
                for p in (tmp_path / 'out').iterdir()) == ['feature', 'fix']


def am(checkout, *patches):
  git.run('am', '-q', '-k', *map(str, patches), cwd=checkout, isolated=False)


def test_export_writes_one_folder_per_pull_request(project, tmp_path):
  dest = tmp_path / 'out'
  upstream.export(project, dest)
  assert sorted(p.name for p in dest.iterdir()) == ['feature', 'fix']
  for name in ('fix', 'feature'):
    assert sorted(p.name for p in (dest / name).iterdir()) == [
        'CHANGES-entries.md', 'pull-request.md', 'series', 'squashed.patch'
    ]
    assert (dest / name / 'pull-request.md').read_text() == (
        testing.DESCRIPTIONS[name])
  assert [p.name for p in (dest / 'feature' / 'series').iterdir()
          ] == ['0001-Python-Add-a-module.patch']
  assert (dest / 'fix' / 'CHANGES-entries.md').read_text() == (
      '## Bugfixes\n\n* (Python) Fixed a bug '
      '([#2](https://github.com/apache/beam/issues/2)).\n')
  assert 'Added a thing' in (dest / 'feature' /
                             'CHANGES-entries.md').read_text()
  with pytest.raises(Error, match='already exists'):
    upstream.export(project, dest)


def test_exported_series_apply_in_order_with_git_am_k(project, tmp_path):
  dest = tmp_path / 'out'
  upstream.export(project, dest)
  checkout = make_checkout(project, tmp_path / 'beam')
  for name in ('fix', 'feature'):
    am(checkout, *sorted((dest / name / 'series').glob('*.patch')))
  assert tree_id(checkout) == tree_id(project.tree)
  assert git.output(
      'log',
      '--format=%s|%an|%ad',
      '--date=raw',
      f'{tree.BASE_TAG}..HEAD',
      cwd=checkout).splitlines() == [
          f'{subject}|Test Author|{date}' for subject, date in zip(
              ['[Python] Add a module', '[Python] Change line 5'], git.output(
                  'log', '--format=%ad', '--date=raw', f'{tree.BASE_TAG}..',
                  cwd=project.tree).splitlines())
      ]


def test_squashed_patches_apply_in_order(project, tmp_path):
  dest = tmp_path / 'out'
  upstream.export(project, dest)
  checkout = make_checkout(project, tmp_path / 'beam')
  am(checkout, dest / 'fix' / 'squashed.patch')
  am(checkout, dest / 'feature' / 'squashed.patch')
  assert tree_id(checkout) == tree_id(project.tree)
  text = (dest / 'feature' / 'squashed.patch').read_text()
  assert 'Subject: [Python] Add a module\n' in text
  assert 'Why and what.' in text
  assert 'From: Test Author <author@example.com>' in text
  assert git.output(
      'log', '-1', '--format=%B',
      cwd=checkout) == ('[Python] Add a module\n\nWhy and what.')


def test_export_carries_the_exporters_name(project, tmp_path, monkeypatch):
  monkeypatch.setenv('GIT_AUTHOR_NAME', 'The Exporter')
  monkeypatch.setenv('GIT_AUTHOR_EMAIL', 'exporter@example.com')
  upstream.export(project, tmp_path / 'out')
  for patch in (tmp_path / 'out').rglob('*.patch'):
    assert 'From: The Exporter <exporter@example.com>' in patch.read_text()
  check.check(project)  # patches/ are left as they were


def test_export_one_pull_request(project, tmp_path, capsys):
  dest = tmp_path / 'out'
  upstream.export(project, dest, ['feature'])
  assert [p.name for p in dest.iterdir()] == ['feature']
  with pytest.raises(Error, match="no pull request 'nope'"):
    upstream.export(project, tmp_path / 'other', ['nope'])
  assert not (tmp_path / 'other').exists()
  upstream.export(project, tmp_path / 'twice', ['feature', 'feature'])
  assert [p.name for p in (tmp_path / 'twice').iterdir()] == ['feature']
  assert capsys.readouterr().out.count('wrote ') == 2
  (tmp_path / 'a-file').write_text('')
  with pytest.raises(Error, match='cannot make the folder .*a-file'):
    upstream.export(project, tmp_path / 'a-file' / 'out')


# --------------------------------------------------------------------------
# The real queue of this repository against the real pinned base.


def test_a_later_change_to_a_new_file_applies_and_exports(follow_up, tmp_path):
  project = follow_up
  applied = make_checkout(project, tmp_path / 'applied')
  upstream.apply(project, applied)
  assert tree_id(applied) == tree_id(project.tree)
  dest = tmp_path / 'out'
  upstream.export(project, dest)
  adds, changes_line_5 = sorted((dest / 'fix' / 'series').glob('*.patch'))
  changes = sorted((dest / 'feature' / 'series').glob('*.patch'))
  assert f'+++ b/{MODULE_PATH}\n@@ -0,0 +1,20 @@\n' in adds.read_text()
  assert 'module line' not in changes_line_5.read_text()
  assert '-module line 3\n+three\n' in changes[0].read_text()
  assert [p.name for p in changes] == [
      '0001-Python-Change-mod-and-line-30.patch',
      '0002-Python-Change-mod-again.patch',
  ]
  checkout = make_checkout(project, tmp_path / 'beam')
  git.run(
      'am',
      '-q',
      '-3',
      '-k',
      str(adds),
      str(changes_line_5),
      *map(str, changes),
      cwd=checkout,
      isolated=False)
  assert tree_id(checkout) == tree_id(project.tree)
  assert git.output(
      'show', f'HEAD~3:{MODULE_PATH}', cwd=checkout) + '\n' == module_at(1)
  squashed = make_checkout(project, tmp_path / 'squashed')
  am(squashed, dest / 'fix' / 'squashed.patch')
  am(squashed, dest / 'feature' / 'squashed.patch')
  assert tree_id(squashed) == tree_id(project.tree)


@pytest.fixture(scope='module')
def real_tree(tmp_path_factory):
  project = Project()
  built = tmp_path_factory.mktemp('real') / 'beam'
  tree.build(project, built, quiet=True)
  return project, built


def test_real_queue_applies_to_a_base_checkout(real_tree, tmp_path):
  project, built = real_tree
  checkout = tmp_path / 'beam'
  subprocess.run(['git', 'clone', '-q', str(built), str(checkout)], check=True)
  git.run('reset', '-q', '--hard', tree.BASE_TAG, cwd=checkout)
  upstream.apply(project, checkout)
  assert tree_id(checkout) == tree_id(built)


def test_real_pull_requests_export_and_apply_in_order(real_tree, tmp_path):
  project, built = real_tree
  dest = tmp_path / 'out'
  upstream.export(project, dest)
  checkout = tmp_path / 'beam'
  subprocess.run(['git', 'clone', '-q', str(built), str(checkout)], check=True)
  git.run('reset', '-q', '--hard', tree.BASE_TAG, cwd=checkout)
  series = project.read_series()
  for pr in series.pull_requests:
    am(checkout, dest / pr.name / 'squashed.patch')
  assert tree_id(checkout) == tree_id(built)
  assert len(series.pull_requests) == len(list(dest.iterdir()))
