from cronwarden.cli import console

console()
