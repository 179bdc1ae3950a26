# Repository root on sys.path for tests run from a checkout (an installed package needs none).
