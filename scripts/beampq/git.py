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

"""Every git command beampq runs goes through this module.

Commands on repositories the tool owns (build/beam, scratch trees) run
isolated: the user's and the system's git config are ignored, so that hooks,
signing or aliases cannot change how a tree is built. The identity the tool
commits with comes from git itself through `identity`, asked in the
patch-set repository: ``user.name`` and ``user.email`` from that clone's own
config, the user's global config or the system's, or the ``GIT_AUTHOR_*``
and ``GIT_COMMITTER_*`` variables, as git itself would commit there.
"""

import dataclasses
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from beampq import Error


@dataclasses.dataclass(frozen=True)
class Identity:
  """A person as git records one: name and email."""
  name: str
  email: str

  def env(self, role: str, date: Optional[str] = None) -> dict[str, str]:
    """The variables that make git record this identity as role
    ('AUTHOR' or 'COMMITTER'), at date when given."""
    env = {
        f'GIT_{role}_NAME': self.name,
        f'GIT_{role}_EMAIL': self.email,
    }
    if date is not None:
      env[f'GIT_{role}_DATE'] = date
    return env

  def __str__(self):
    return f'{self.name} <{self.email}>'


def _environment(isolated: bool, env: Optional[dict[str, str]]):
  full = dict(os.environ, LC_ALL='C', TZ='UTC')
  if isolated:
    full.update(GIT_CONFIG_NOSYSTEM='1', GIT_CONFIG_GLOBAL=os.devnull)
  full.update(env or {})
  return full


def attempt(
    *args: str,
    cwd: Path,
    isolated: bool = True,
    env: Optional[dict[str, str]] = None,
    stdin: Optional[str] = None) -> subprocess.CompletedProcess:
  """Runs git and returns the result, whether it succeeded or not."""
  return subprocess.run(['git', *args],
                        cwd=cwd,
                        env=_environment(isolated, env),
                        input=stdin,
                        capture_output=True,
                        text=True,
                        check=False)


def run(*args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
  """Runs git; a failure raises Error with git's error line (its last
  "fatal:" or "error:" line, else its last line)."""
  result = attempt(*args, cwd=cwd, **kwargs)
  if result.returncode != 0:
    raise Error(
        f'git {" ".join(args[:2])} failed in {cwd}: {error_line(result)}')
  return result


def error_line(result: subprocess.CompletedProcess) -> str:
  """What a failed git said went wrong: its last "fatal:" or "error:" line,
  else its last line that is not a hint."""
  lines = [
      line for line in (result.stderr or result.stdout).strip().splitlines()
      if not line.startswith('hint:')
  ]
  errors = [l for l in lines if l.startswith(('fatal:', 'error:'))]
  return (errors or lines or [f'exit code {result.returncode}'])[-1]


def output(*args: str, cwd: Path, **kwargs) -> str:
  """Runs git and returns its output, stripped."""
  return run(*args, cwd=cwd, **kwargs).stdout.strip()


def binary_output(*args: str, cwd: Path) -> bytes:
  """Runs isolated git and returns its output as bytes (blobs, archives)."""
  result = subprocess.run(['git', *args],
                          cwd=cwd,
                          env=_environment(True, None),
                          capture_output=True,
                          check=False)
  if result.returncode != 0:
    raise Error(
        f'git {" ".join(args[:2])} failed in {cwd}: '
        f'{result.stderr.decode(errors="replace").strip()}')
  return result.stdout


def identity(
    role: str = 'AUTHOR',
    cwd: Optional[Path] = None,
    fallback: Optional[Identity] = None) -> Identity:
  """Who the user is to git, as role ('AUTHOR' or 'COMMITTER'), asked in cwd
  (default: the current directory): a repository's own config counts, so
  callers pass the patch-set repository, not the trees the tool owns. When
  git knows nobody: fallback if given, else an error."""
  result = attempt(
      'var', f'GIT_{role}_IDENT', cwd=cwd or Path.cwd(), isolated=False)
  line = result.stdout.strip()
  name, _, rest = line.partition(' <')
  email = rest.split('>', 1)[0]
  if result.returncode != 0 or not name or not email:
    if fallback is not None:
      return fallback
    raise Error(
        f'git does not know who you are in {cwd or Path.cwd()}: set '
        '`git config user.name` and `user.email` (in this clone, or with '
        '--global) (beampq writes patches and commits in your name)')
  return Identity(name, email)


def dirty_paths(repo: Path, isolated: bool = True) -> list[str]:
  """Uncommitted and untracked changes, as `git status --porcelain` entries
  ("XY path"), read with -z so that each path is as on disk: unquoted,
  also with spaces or non-ASCII characters."""
  fields = iter(
      run('status', '--porcelain', '-z', cwd=repo,
          isolated=isolated).stdout.split('\0'))
  entries = []
  for field in fields:
    if not field:
      continue
    entries.append(field)
    if field[0] in 'RC':
      # The path it was renamed or copied from follows.
      next(fields, None)
  return entries


def operation_in_progress(repo: Path) -> Optional[str]:
  """The git operation (am, rebase, merge, cherry-pick, bisect) stopped half
  way in repo, or None."""
  git_dir = Path(output('rev-parse', '--absolute-git-dir', cwd=repo))
  for name, what in (('rebase-apply', 'git am or rebase'),
                     ('rebase-merge', 'rebase'), ('MERGE_HEAD', 'merge'),
                     ('CHERRY_PICK_HEAD', 'cherry-pick'),
                     ('BISECT_LOG', 'bisect')):
    if (git_dir / name).exists():
      return what
  return None


def current_branch(repo: Path) -> str:
  """The branch checked out in repo; '' at a detached HEAD."""
  return output('branch', '--show-current', cwd=repo)


def commits_since(repo: Path, since: str, until: str = 'HEAD') -> list[str]:
  """The commits since..until, oldest first."""
  return output('rev-list', '--reverse', f'{since}..{until}', cwd=repo).split()


def commits_touching(repo: Path, since: str,
                     path: str) -> list[tuple[str, str]]:
  """The commits since..HEAD that change path, oldest first, each as its
  short hash and subject."""
  lines = output(
      'log',
      '--reverse',
      '--format=%h %s',
      f'{since}..HEAD',
      '--',
      path,
      cwd=repo).splitlines()
  return [tuple((line.split(' ', 1) + [''])[:2]) for line in lines]


def set_author(
    repo: Path, since: str, author: Identity, committer: Identity) -> int:
  """Makes author the author of every commit since..HEAD (committed by
  committer), keeping each commit's dates, message and files; returns how
  many commits changed.

  The branch is rewritten with plumbing, so the work tree and the index,
  which hold the same files, are left alone.
  """
  parent = since
  rewritten = 0
  for commit in commits_since(repo, since):
    name, email, authored, committed = output(
        'log', '-1', '--format=%an%n%ae%n%aI%n%cI', commit,
        cwd=repo).split('\n')
    if rewritten == 0 and (name, email) == (author.name, author.email):
      parent = commit
      continue
    raw = output('cat-file', 'commit', commit, cwd=repo)
    message = raw.split('\n\n', 1)[1] + '\n' if '\n\n' in raw else ''
    parent = output(
        'commit-tree',
        f'{commit}^{{tree}}',
        '-p',
        parent,
        cwd=repo,
        stdin=message,
        env={
            **author.env('AUTHOR', authored),
            **committer.env('COMMITTER', committed)
        })
    rewritten += 1
  if rewritten:
    run(
        'update-ref',
        '-m',
        f'beampq: author {author}',
        'HEAD',
        parent,
        cwd=repo)
  return rewritten


def patch_subject(patch_text: str) -> str:
  """The commit subject a `git format-patch` file carries, without the
  [PATCH] prefix."""
  info = run(
      'mailinfo',
      '-b',
      os.devnull,
      os.devnull,
      cwd=Path.cwd(),
      stdin=patch_text).stdout
  for line in info.splitlines():
    if line.startswith('Subject: '):
      return line[len('Subject: '):]
  return ''


def message_as_applied(patch_text: str) -> str:
  """The body of the commit message that `git am --keep-non-patch` takes
  from a `git format-patch` file: it ends at the first line that git reads
  as the start of the diff (a line of `---`, say), wherever that is."""
  with tempfile.TemporaryDirectory() as scratch:
    message = Path(scratch) / 'message'
    run(
        'mailinfo',
        '-b',
        str(message),
        os.devnull,
        cwd=Path(scratch),
        stdin=patch_text)
    return message.read_text()


def patch_id(patch_text: str) -> Optional[str]:
  """git's stable id of a patch's diff (the same for a reworded commit), or
  None when the patch has no diff."""
  out = run('patch-id', '--stable', cwd=Path.cwd(), stdin=patch_text).stdout
  return out.split()[0] if out.strip() else None


def patched_paths(patch_text: str) -> list[str]:
  """The files a `git format-patch` file changes."""
  return re.findall(r'^diff --git a/(\S+) b/', patch_text, re.M)


def verify_applies_exactly(
    repo: Path, patch: Path, label: str, options: tuple[str, ...] = ()):
  """Fails unless the patch applies to repo exactly (with git apply's
  options, such as -R): no fuzz, no offsets. label names the patch in the
  error."""
  if '\ndiff --git ' not in patch.read_text():
    return  # Only new files, which travel in sdks/: nothing to apply.
  result = attempt(
      'apply', '--check', '--verbose', *options, str(patch), cwd=repo)
  said = result.stdout + result.stderr
  if result.returncode != 0:
    failed = re.search(r'error: patch failed: (\S+):(\d+)', said)
    missing = re.search(r'error: (\S+): (does not exist|No such file)', said)
    if failed:
      where = f'{failed.group(1)} (hunk at line {failed.group(2)})'
    elif missing:
      where = f'{missing.group(1)} (no such file)'
    else:
      where = said.strip().splitlines()[-1] if said.strip() else '?'
    raise Error(f'{label} does not apply: {where}')
  moved = re.search(r'Hunk #(\d+) succeeded at (\d+) \((offset|fuzz)', said)
  if moved:
    current = re.findall(
        r'^Checking patch (\S+)\.\.\.', said[:moved.start()], re.M)
    raise Error(
        f'{label} applies only with an {moved.group(3)}: '
        f'{current[-1] if current else "?"} hunk #{moved.group(1)} lands at '
        f'line {moved.group(2)}')


def side_work(
    repo: Path,
    own_tags: tuple[str, ...] = (),
    own_branches: tuple[str, ...] = ()
) -> list[str]:
  """What a repository holds besides its checked-out branch: its stashes,
  its other branches but own_branches and its tags but own_tags,
  described."""
  found = []
  stashes = output('stash', 'list', cwd=repo).splitlines()
  if stashes:
    found.append('1 stash' if len(stashes) == 1 else f'{len(stashes)} stashes')
  current = current_branch(repo)
  branches = [
      b for b in output(
          'for-each-ref', '--format=%(refname:short)', 'refs/heads',
          cwd=repo).splitlines() if b != current and b not in own_branches
  ]
  if branches:
    found.append(f'branches {", ".join(branches)}')
  tags = [
      t for t in output(
          'for-each-ref', '--format=%(refname:short)', 'refs/tags',
          cwd=repo).splitlines() if t not in own_tags
  ]
  if tags:
    found.append(f'tags {", ".join(tags)}')
  return found


def changed_paths(repo: Path,
                  since: str,
                  until: Optional[str] = None) -> tuple[list[str], list[str]]:
  """The files changed since commit since and the files added: at commit
  until, or in repo's work tree when until is None (uncommitted and
  untracked work included)."""
  changed = output(
      'diff',
      '--name-status',
      '--no-renames',
      since,
      *([until] if until else []),
      cwd=repo).splitlines()
  modified = sorted(
      line.split('\t', 1)[1] for line in changed if line[0] in 'MT')
  added = [line.split('\t', 1)[1] for line in changed if line[0] == 'A']
  if until is None:
    added += output(
        'ls-files', '--others', '--exclude-standard', cwd=repo).splitlines()
  return modified, sorted(added)
