// Status and Result<T>: failures a caller is expected to handle.
//
// A Status is either ok or carries an error code and a human-readable
// message that says what was wrong and where ("region header: ring_capacity
// 3 is not a power of two").  Result<T> holds a value or a non-ok Status.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace perfq {

enum class Errc {
  kOk = 0,
  kInvalidArgument,  // the caller passed something unusable
  kCorrupt,          // data from a peer or a file failed validation
  kIo,               // a system call failed (errno in the message)
  kNotFound,
  kTimeout,
  kUnavailable,  // the peer is gone or not ready
  kExists,       // a file that must be new is already there (EEXIST)
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  // An error from a failed system call: "what: strerror(errno)".
  static Status from_errno(const std::string& what, int err = errno);

  bool is_ok() const { return code_ == Errc::kOk; }
  explicit operator bool() const { return is_ok(); }
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Errc code_ = Errc::kOk;
  std::string message_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit on purpose
  Result(Status status) : v_(std::move(status)) {}  // NOLINT

  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }

  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }

  Status status() const { return is_ok() ? Status::ok() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace perfq
