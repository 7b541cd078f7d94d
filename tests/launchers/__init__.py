# A package, so that its conftest.py (launchers.conftest) does not shadow tests/conftest.py,
# which every test folder imports as `conftest`.
