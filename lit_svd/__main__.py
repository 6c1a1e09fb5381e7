from lit_svd.cli import main

if __name__ == "__main__":
    main()
