def main() -> None: print("ok")
