from imgbuild.cli import main

main()
