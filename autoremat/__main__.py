from autoremat._cli import main

main()
