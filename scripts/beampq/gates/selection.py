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

"""The tests the queue adds or changes, read from the syntax trees of each
test module on the base and on the patched tree.

A selection maps a test module (relative to the sdk folder) to what runs of
it: ALL for the whole module, or {class name: ALL or test names}, where ''
stands for the module's own test functions. A test name also selects the
tests that parameterized.expand makes of it (name_0_..., name_1_...).

Comments and formatting do not count: two definitions are the same when
their syntax trees are. What a change reaches is worked out conservatively:
- a module the queue adds, or one whose module-level code (other than its
  imports, its classes and its main block) changes, runs whole;
- a class whose bases, decorators, attributes or non-test methods (setUp, a
  helper) change runs whole, and so do the classes below it in the module;
- otherwise a class runs the tests it adds or changes, and those it
  inherits from a class of the module that adds or changes them.
"""

import ast
from pathlib import Path
from typing import Optional
from typing import Union

ALL = '*'

Tests = Union[str, list[str]]
Selection = dict[str, Union[str, dict[str, Tests]]]


def _is_test(name: str) -> bool:
  return name.startswith('test')


def _is_main_block(node: ast.stmt) -> bool:
  return isinstance(node, ast.If) and '__main__' in ast.dump(node.test)


class _ClassShape:
  """A test class as the comparison sees it: its own parts apart from its
  methods, and each method's syntax tree."""
  def __init__(self, node: ast.ClassDef):
    self.bases = [ast.unparse(base) for base in node.bases]
    own = [
        ast.dump(part)
        for part in node.bases + node.keywords + node.decorator_list
    ]
    self.methods: dict[str, str] = {}
    for part in node.body:
      if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self.methods[part.name] = ast.dump(part)
      else:
        own.append(ast.dump(part))
    self.own = own

  def helpers(self) -> dict[str, str]:
    return {n: d for n, d in self.methods.items() if not _is_test(n)}


def _bound_names(node: ast.stmt) -> set[str]:
  """The module-level names a statement binds."""
  if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
    return {node.name}
  if isinstance(node, (ast.Import, ast.ImportFrom)):
    return {(alias.asname or alias.name).split('.')[0] for alias in node.names}
  return {
      name.id
      for name in ast.walk(node)
      if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
  }


class _ModuleShape:
  """A test module's classes, test functions and other module-level code."""
  def __init__(self, source: str):
    self.classes: dict[str, _ClassShape] = {}
    self.functions: dict[str, str] = {}
    self.other: dict[str, set[str]] = {}
    self.names: set[str] = set()
    for node in ast.parse(source).body:
      if _is_main_block(node):
        continue
      self.names |= _bound_names(node)
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        continue
      if isinstance(node, ast.ClassDef):
        self.classes[node.name] = _ClassShape(node)
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self.functions[node.name] = ast.dump(node)
      else:
        self.other[ast.dump(node)] = _bound_names(node)

  def reaches_old_tests(self, base: '_ModuleShape') -> bool:
    """Whether this module-level code, against base's, can change what a
    test that is in both does: a helper or statement of base's changed or
    gone, or a new one that binds a name base already had."""
    for name, dump in base.functions.items():
      if not _is_test(name) and self.functions.get(name) != dump:
        return True
    if any(statement not in self.other for statement in base.other):
      return True
    added = [
        names for statement, names in self.other.items()
        if statement not in base.other
    ] + [{name} for name in self.functions if name not in base.functions]
    return any(names & base.names for names in added)


def _changed(base: dict[str, str], tree: dict[str, str]) -> list[str]:
  return [name for name in tree if base.get(name) != tree[name]]


def module_selection(base_source: Optional[str],
                     tree_source: str) -> Union[str, dict[str, Tests]]:
  """What runs of one test module; base_source is None for a new one.
  Changes that remove code count as changes of what remains: a removed
  helper makes its module or class run whole."""
  if base_source is None:
    return ALL
  base, tree = _ModuleShape(base_source), _ModuleShape(tree_source)
  if tree.reaches_old_tests(base):
    return ALL
  chosen: dict[str, Tests] = {}
  own_functions = [
      n for n in _changed(base.functions, tree.functions) if _is_test(n)
  ]
  if own_functions:
    chosen[''] = own_functions
  for name, shape in tree.classes.items():
    before = base.classes.get(name)
    if (before is None or before.own != shape.own or
        before.helpers() != shape.helpers()):
      chosen[name] = ALL
    else:
      tests = _changed(before.methods, shape.methods)
      if tests:
        chosen[name] = tests
  # A class runs what its bases in the module run: their tests are its.
  grew = True
  while grew:
    grew = False
    for name, shape in tree.classes.items():
      for base_name in shape.bases:
        inherited = chosen.get(base_name)
        if inherited is None or chosen.get(name) == ALL:
          continue
        if inherited == ALL:
          merged: Tests = ALL
        else:
          current = chosen.get(name, [])
          assert isinstance(current, list)
          merged = current + [t for t in inherited if t not in current]
        if merged != chosen.get(name):
          chosen[name] = merged
          grew = True
  return chosen


def series_tests(base_sdk: Path, sdk: Path, modules: list[str]) -> Selection:
  """The selection of each module (paths relative to the sdk folders)."""
  selection: Selection = {}
  for module in modules:
    base_file = base_sdk / module
    base_source = base_file.read_text() if base_file.is_file() else None
    selection[module] = module_selection(
        base_source, (sdk / module).read_text())
  return selection


def is_selected(
    selection: Selection, module: str, class_name: str, test_name: str) -> bool:
  """Whether a collected test (class_name '' for a function) runs."""
  chosen = selection.get(module)
  if chosen is None:
    return False
  if chosen == ALL:
    return True
  assert isinstance(chosen, dict)
  tests = chosen.get(class_name)
  if tests is None:
    return False
  if tests == ALL:
    return True
  return any(
      test_name == name or test_name.startswith(name + '_') for name in tests)


def count(selection: Selection) -> str:
  """A line that says what the selection runs, for the log."""
  parts = []
  for module, chosen in selection.items():
    if chosen == ALL:
      parts.append(f'{module}: whole')
    elif chosen:
      assert isinstance(chosen, dict)
      whole = sorted(name for name, tests in chosen.items() if tests == ALL)
      some = sum(len(tests) for tests in chosen.values() if tests != ALL)
      parts.append(
          f'{module}: {len(whole)} classes whole, {some} tests of others')
    else:
      parts.append(f'{module}: nothing')
  return '; '.join(parts)
