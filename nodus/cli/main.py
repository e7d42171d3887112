def main() -> None:
    print("nodus")
