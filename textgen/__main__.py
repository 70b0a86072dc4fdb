from textgen.cli import main

main()
