from optcheck.cli import main

main()
