import sys

from lit_svd.cli import PROG, main

if __name__ == "__main__":
    sys.argv[0] = PROG  # usage lines read "python -m lit_svd ...", not "__main__.py"
    main()
