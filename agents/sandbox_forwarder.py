"""The forwarder that runs inside a rollout's sandbox: a TCP port on the sandbox's own loopback whose connections go,
byte for byte, to the model gateway's unix socket bound into the sandbox. An agent that only speaks OpenAI over
HTTP (``OPENAI_BASE_URL=http://127.0.0.1:<port>/rollouts/<id>/v1``) reaches the gateway this way while the sandbox
has no network at all.

Run as ``python3 -c "<this file's source>" SOCKET PORT_FILE``: the standard library only, any Python 3.8 or later
(the sandbox's own). It listens on 127.0.0.1 at a free port, writes the port to PORT_FILE once it listens, and ends
when its parent (the agent's shell) has gone. ``ExternalAgent`` starts it before the agent's command and stops it
after.
"""

import asyncio
import os
import sys

CHUNK = 65536


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


async def _serve(socket_path: str, port_file: str) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open(port_file + ".part", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".part", port_file)  # the agent's shell reads it whole or not at all
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    server.close()


def main(argv: list) -> int:
    if len(argv) != 3:
        print("usage: forwarder SOCKET PORT_FILE", file=sys.stderr)
        return 2
    asyncio.run(_serve(argv[1], argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
