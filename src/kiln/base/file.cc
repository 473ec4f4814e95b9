// Whole-file reads and atomic writes.
#include "kiln/base/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln {

namespace fs = std::filesystem;

Result<std::string> readFileBytes(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return ioError("'{}' does not exist", path.string());
  if (fs::is_directory(path, ec)) return ioError("'{}' is a directory, not a file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) return ioError("cannot open '{}': {}", path.string(), std::strerror(errno));
  // Into a string reserved at the file's size: one copy in memory, not a stream's growing buffer
  // and then a second copy. A file that changes size while it is read is read to its end.
  std::string bytes;
  const uintmax_t size = fs::file_size(path, ec);
  if (!ec) bytes.reserve(static_cast<size_t>(size));
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) bytes.append(chunk, in.gcount());
  if (in.bad()) return ioError("error reading '{}'", path.string());
  return bytes;
}

fs::path temporaryPathFor(const fs::path& path) {
  return fs::path(path.string() + ".tmp." + std::to_string(::getpid()));
}

Status commitTemporary(const fs::path& temporary, const fs::path& path) {
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::error_code ec;
    fs::remove(temporary, ec);
    return ioError("cannot move '{}' into place as '{}': {}", temporary.string(), path.string(),
                   std::strerror(error));
  }
  return Status::ok();
}

Status writeFileAtomically(const fs::path& path, std::string_view bytes) {
  const fs::path temporary = temporaryPathFor(path);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return ioError("cannot write '{}': {}", path.string(), std::strerror(errno));
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      return ioError("cannot write '{}': {}", path.string(), std::strerror(error));
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return ioError("cannot write '{}': {}", path.string(), std::strerror(error));
  }
  return commitTemporary(temporary, path);
}

}  // namespace kiln
