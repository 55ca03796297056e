from zgtool.cli import main

main()
