import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:  # python -m lit_svd report MODEL --out DIR (lit_svd/report.py)
        from lit_svd.report import main as report

        report(sys.argv[2:])
    else:
        from lit_svd import PROG
        from lit_svd.cli import main

        sys.argv[0] = PROG  # usage lines read "python -m lit_svd ...", not "__main__.py"
        main()
