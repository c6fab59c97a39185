"""Development checks beyond ruff: the type checker over the product packages."""
