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

"""The queue outside this repository: applied to a Beam checkout, or
exported as one folder per upstream pull request.

Both write patches with `git format-patch -k` from a tree built by `tree`:
the subjects are the commits' own, `[Python]` tag included, and `git am -k`
keeps them so (plain `git am` would strip the tag). Each patch is its
commit's own change: a commit that adds a file adds it as it was added, and
a later commit's change to that file is an ordinary diff, so the patches
apply in order.
"""

import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from beampq import Error
from beampq import changes
from beampq import git
from beampq import series as series_model
from beampq import tree
from beampq.project import Project

FORMAT_PATCH = (
    'format-patch',
    '--quiet',
    '-k',
    '--zero-commit',
    '--no-signature',
    '--full-index')


def _format_range(repo: Path, since: str, until: str, out: Path) -> list[Path]:
  """`git format-patch -k` of since..until into out, numbered from 1."""
  out.mkdir(parents=True, exist_ok=True)
  git.run(*FORMAT_PATCH, '-o', str(out), f'{since}..{until}', cwd=repo)
  return sorted(out.glob('*.patch'))


def _am(checkout: Path, patch: Path, committer: git.Identity) -> Optional[str]:
  """`git am -3 -k` of one patch in the user's checkout; returns None, or
  the file the patch failed on ('' when git does not say)."""
  result = git.attempt(
      'am',
      '-3',
      '-k',
      '--quiet',
      '--empty=keep',
      str(patch),
      cwd=checkout,
      isolated=False,
      env=committer.env('COMMITTER'))
  if result.returncode == 0:
    return None
  # --quiet hides git's conflict lines; the index still names the files.
  unmerged = git.output(
      'diff', '--name-only', '--diff-filter=U', cwd=checkout,
      isolated=False).split()
  if unmerged:
    return ', '.join(unmerged)
  where = re.findall(r'patch failed: (\S+)', result.stdout + result.stderr)
  return where[0] if where else ''


def _check_not_applied(checkout: Path, patches: list[Path]):
  """Refuses a checkout whose recent history already has one of the
  patches' subjects: the series was applied there before, and git am -3
  would apply it again as empty commits."""
  recent = set(
      git.output('log', '-500', '--format=%s', cwd=checkout,
                 isolated=False).splitlines())
  for patch in patches:
    subject = git.patch_subject(patch.read_text())
    if subject in recent:
      raise Error(
          f'{checkout} already has a commit "{subject}" ({patch.name}): the '
          'series was applied there before; apply it to a checkout without '
          'it')


def _verify_checkout(project: Project, checkout: Path):
  if not checkout.is_dir():
    raise Error(f'{checkout} is not a directory')
  top = git.attempt('rev-parse', '--show-toplevel', cwd=checkout)
  if top.returncode != 0 or Path(top.stdout.strip()).resolve() != checkout:
    raise Error(f'{checkout} is not the top of a git checkout')
  if not (checkout / project.base.subdir / 'apache_beam' /
          '__init__.py').is_file():
    raise Error(
        f'{checkout} is not a Beam checkout: it has no '
        f'{project.base.subdir}/apache_beam package')
  in_progress = git.operation_in_progress(checkout)
  if in_progress:
    raise Error(f'a {in_progress} is in progress in {checkout}')
  dirty = git.dirty_paths(checkout, isolated=False)
  if dirty:
    more = ', ...' if len(dirty) > 1 else ''
    raise Error(
        f'{checkout} has uncommitted changes ({dirty[0].strip()}{more}): '
        'commit them, or stash them (`git stash -u` for untracked files) '
        'first')


def _committer(project: Project, checkout: Path) -> git.Identity:
  """Who commits in the user's checkout (and writes its CHANGES.md commit):
  the identity git has there, else the one it has in this patch set's clone
  (which export commits as)."""
  try:
    return git.identity('COMMITTER', checkout)
  except Error:
    return git.identity('COMMITTER', project.root)


def apply(project: Project, checkout: Path):
  """Applies the whole queue to a Beam checkout with `git am -3 -k`, then
  adds our CHANGES.md entries in a commit of their own. On any failure the
  checkout is reset to where it was."""
  checkout = checkout.resolve()
  _verify_checkout(project, checkout)
  committer = _committer(project, checkout)
  entries = changes.read(project.changes)
  original = git.output('rev-parse', 'HEAD', cwd=checkout, isolated=False)
  with tree.snapshot(project) as repo, \
      tempfile.TemporaryDirectory() as scratch:
    patches = _format_range(repo, tree.BASE_TAG, 'HEAD', Path(scratch))
    _check_not_applied(checkout, patches)
    try:
      for patch in patches:
        failed = _am(checkout, patch, committer)
        if failed is not None:
          raise Error(
              f'{patch.name} does not apply to {checkout}'
              f'{": " + failed if failed else ""} (git am -3 failed; the '
              'checkout is left as it was)')
      changes_file = checkout / 'CHANGES.md'
      note = 'no CHANGES.md there, so no entries added'
      if changes_file.is_file():
        try:
          text, added = changes.insert(changes_file.read_text(), entries)
        except Error as e:
          raise Error(
              f'{changes_file}: {e}; the checkout is left as it was') from e
        if added:
          changes_file.write_text(text)
          git.run('add', 'CHANGES.md', cwd=checkout, isolated=False)
          git.run(
              'commit',
              '-q',
              '-m',
              'Add CHANGES.md entries for prefix-aware batching',
              cwd=checkout,
              isolated=False,
              env={
                  **committer.env('AUTHOR'), **committer.env('COMMITTER')
              })
        note = f'CHANGES.md: {added} entries added to the Unreleased section'
    except BaseException:
      git.attempt('am', '--abort', cwd=checkout, isolated=False)
      git.run('reset', '-q', '--hard', original, cwd=checkout, isolated=False)
      raise
  for patch in patches:
    print(f'beampq: applied {patch.name}')
  print(f'beampq: {checkout}: {len(patches)} patches applied; {note}')


def _squash(
    repo: Path,
    since: str,
    until: str,
    description: series_model.Description,
    author: git.Identity) -> str:
  """One commit holding since..until, with the pull request's title and
  description as its message, by author, dated as the newest of them."""
  dates = git.output(
      'log', '--format=%at %ai', f'{since}..{until}', cwd=repo).splitlines()
  date = max(dates, key=lambda line: int(line.split()[0])).split(' ', 1)[1]
  return git.output(
      'commit-tree',
      f'{until}^{{tree}}',
      '-p',
      since,
      cwd=repo,
      stdin=description.commit_message(),
      env={
          **author.env('AUTHOR', date), **author.env('COMMITTER', date)
      })


def _write_pull_request(
    project: Project,
    repo: Path,
    pr: series_model.PullRequest,
    since: str,
    until: str,
    entries: list[changes.Entry],
    author: git.Identity,
    out: Path):
  """Writes out/: series/ (the pull request's commits, git-am-able),
  squashed.patch, pull-request.md and CHANGES-entries.md."""
  description = project.read_description(pr.name)
  out.mkdir()
  _format_range(repo, since, until, out / 'series')
  squashed = _squash(repo, since, until, description, author)
  made = _format_range(repo, since, squashed, out / 'squashed')
  made[0].rename(out / 'squashed.patch')
  (out / 'squashed').rmdir()
  (out / 'pull-request.md').write_text(description.markdown())
  own = [entry for entry in entries if entry.pull_request == pr.name]
  (out / 'CHANGES-entries.md').write_text(changes.to_text(own))


def export(project: Project, dest: Path, names: Optional[list[str]] = None):
  """Writes dest/<name>/ for each pull request of the series (or those in
  names): its patches, one squashed patch, its title and description, and
  its own CHANGES.md entries. The patches carry the exporter's name (git's
  identity) and keep their dates; each folder applies on top of the pull
  requests before it in the series."""
  dest = dest.resolve()
  if dest.exists():
    raise Error(f'{dest} already exists; export writes a new folder')
  series = project.read_series()
  # Each named once, however often given.
  wanted = [series.get(name) for name in dict.fromkeys(names)] if names \
      else series.pull_requests
  entries = changes.read(project.changes)
  author = git.identity('AUTHOR', project.root)
  try:
    dest.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise Error(f'cannot make the folder {dest.parent}: {e.strerror}') from None
  scratch = Path(tempfile.mkdtemp(prefix='.export-', dir=dest.parent))
  try:
    out = scratch / 'out'
    out.mkdir()
    with tree.snapshot(project) as built:
      repo = scratch / 'beam'
      git.run('clone', '-q', str(built), str(repo), cwd=scratch)
    base_commit = git.output('rev-parse', tree.BASE_TAG, cwd=repo)
    git.set_author(
        repo, base_commit, author, git.identity('COMMITTER', project.root))
    commits = git.commits_since(repo, base_commit)
    assert len(commits) == len(series.patches), 'one commit per patch'
    position = 0
    for pr in series.pull_requests:
      since = commits[position - 1] if position else base_commit
      until = commits[position + len(pr.patches) - 1]
      position += len(pr.patches)
      if pr.name in {w.name for w in wanted}:
        _write_pull_request(
            project, repo, pr, since, until, entries, author, out / pr.name)
    out.rename(dest)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  for pr in wanted:
    print(f'beampq: wrote {dest / pr.name}/')
  print(
      f'beampq: in a Beam checkout, apply one with '
      f'`git am -3 -k {dest}/<name>/series/*.patch` (or its squashed.patch), '
      'after the pull requests before it in patches/series')
