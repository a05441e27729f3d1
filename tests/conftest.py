"""The order of a test session: the longest test files first, so that the two test processes
(pytest-xdist, a file to each) end together instead of one waiting out a long file started last."""

LONGEST_FIRST = ("test_sampling.py", "test_import.py", "test_coreml_export.py", "test_tool_calls.py",
                 "test_serve.py", "test_train.py", "test_quantize.py")


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest as written
