"""The README's example: a breaker, a timeout and a fallback around an async call."""

import asyncio

import aiohttp

import floodwall as fw

breaker = fw.CircuitBreaker("prices", minimum_calls=5, failure_rate=0.5, open_duration=2.0)
protect = fw.Pipeline(
    fw.Fallback(value={"price": None, "stale": True}),  # outermost: answers when all else fails
    breaker,  # stops calling a dependency that keeps failing
    fw.Timeout(0.2),  # innermost: stops waiting for one slow answer
)


@protect
async def get_price(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url) as response:
        response.raise_for_status()
        return dict(await response.json())


async def main(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            print(await get_price(session, url), breaker.state.name)
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    import sys

    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/price"))
